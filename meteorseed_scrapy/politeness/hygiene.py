"""Per-site request hygiene: the rules a site's config sets for every request sent to it.

Downloader middlewares (registered by the add-on; see docs/politeness.md):

* :class:`BlacklistMiddleware` (60): a URL matching one of the site's ``blacklist`` patterns is
  never fetched (``IgnoreRequest`` naming the pattern: the task is acked as ignored; stats
  ``meteorseed/blacklisted/<site>``). A site with ``robots: false`` gets ``dont_obey_robotstxt``.
* :class:`CookieWarmupMiddleware` (90): for a site with ``cookie_warmup: true``, the first request
  to it on this worker first waits for a GET of the site's home page, so the cookies it sets are
  in the jar (Scrapy's CookiesMiddleware, 700) when the real request goes out.
* :class:`RobotsTxtMiddleware` (100, in place of Scrapy's, which it extends) is on by default
  (``ROBOTSTXT_OBEY`` at add-on priority); it caches one parsed robots.txt per host for the
  crawl.
* :class:`UserAgentPoolMiddleware` (390, before Scrapy's UserAgentMiddleware): the site's
  ``headers`` (as defaults) and a User-Agent from its ``user_agents`` (round-robin), unless the
  request has an explicit one.
* :class:`ProxyPoolMiddleware` (740, before HttpProxyMiddleware): a proxy from the site's
  ``proxies``; connection errors, timeouts, 407 and 5xx count against the proxy, which after
  ``METEORSEED_PROXY_MAX_FAILURES`` in a row cools down for ``METEORSEED_PROXY_COOLDOWN`` s.

The site's config is looked up by the task's ``site_id`` via :func:`site_config`.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request, Spider
from scrapy.downloadermiddlewares.robotstxt import (
    RobotsTxtMiddleware as ScrapyRobotsTxtMiddleware,
)
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from meteorseed_scrapy.context import task_of
from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.schema import SiteConfig

logger = logging.getLogger(__name__)

#: meta key naming the site of a request that carries no task (the warm-up fetch)
SITE_META_KEY = "meteorseed_site"
#: meta key of the proxy the pool chose for a request
PROXY_META_KEY = "meteorseed_proxy"
#: downloads of robots.txt / the warm-up home page tried before giving up on it
FETCH_ATTEMPTS = 3


# -- site configs by site_id ----------------------------------------------------------------


class SiteConfigs:
    """Site configs for one crawler: the running spider's registry when it has one (the
    ``sites`` spider, hot-reloaded there), else one loaded here from ``METEORSEED_SITES_DIR`` and
    re-polled at most every ``METEORSEED_SITES_RELOAD_INTERVAL`` seconds; else none."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self._own: SiteRegistry | None = None
        self._polled = 0.0
        settings = crawler.settings
        self.directory = settings.get("METEORSEED_SITES_DIR") or ""
        self.interval = settings.getfloat("METEORSEED_SITES_RELOAD_INTERVAL", 1.0)

    def registry(self) -> SiteRegistry | None:
        spider = getattr(self.crawler, "spider", None)
        shared = getattr(spider, "registry", None)
        if isinstance(shared, SiteRegistry):
            return shared
        if not self.directory:
            return None
        now = time.monotonic()
        if self._own is None:
            if not Path(self.directory).is_dir():
                if now - self._polled < max(self.interval, 1.0) and self._polled:
                    return None
                if not self._polled:
                    logger.warning("METEORSEED_SITES_DIR %r is not a directory: no site rules",
                                   self.directory)
                self._polled = now  # looked for again (once a second at most)
                return None
            self._own, self._polled = SiteRegistry(self.directory).load(), now
        elif self.interval > 0 and now - self._polled >= self.interval:
            self._polled = now
            self._own.apply(self._own.poll())
        return self._own

    def get(self, site_id: str) -> SiteConfig | None:
        registry = self.registry()
        return registry.get(site_id) if registry is not None else None


_CONFIGS: weakref.WeakKeyDictionary[Any, SiteConfigs] = weakref.WeakKeyDictionary()


def site_configs(crawler: Any) -> SiteConfigs:
    """The one :class:`SiteConfigs` of ``crawler`` (shared by the middlewares)."""
    configs = _CONFIGS.get(crawler)
    if configs is None:
        configs = _CONFIGS[crawler] = SiteConfigs(crawler)
    return configs


def site_config(crawler: Any, site_id: str) -> SiteConfig | None:
    """The rule config of ``site_id`` as this worker knows it now, or ``None``."""
    return site_configs(crawler).get(site_id)


def site_of(request: Request) -> str | None:
    task = task_of(request)
    if task is not None:
        return task.site_id
    site = request.meta.get(SITE_META_KEY)
    return site if isinstance(site, str) else None


class _SiteMiddleware:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.configs = site_configs(crawler)

    @classmethod
    def from_crawler(cls, crawler: Any) -> Any:
        return cls(crawler)

    def config_for(self, request: Request) -> tuple[str, SiteConfig] | None:
        site = site_of(request)
        if site is None:
            return None
        config = self.configs.get(site)
        return None if config is None else (site, config)


# -- blacklist --------------------------------------------------------------------------------


class BlacklistMiddleware(_SiteMiddleware):
    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        found = self.config_for(request)
        if found is None:
            return
        site, config = found
        if not config.robots:
            request.meta.setdefault("dont_obey_robotstxt", True)
        for pattern in config.blacklist:
            if pattern.search(request.url):
                if self.stats is not None:
                    self.stats.inc_value(f"meteorseed/blacklisted/{site}")
                raise IgnoreRequest(f"blacklisted by site {site}: pattern {pattern.pattern!r}")


# -- robots.txt ------------------------------------------------------------------------------


class RobotsTxtMiddleware(ScrapyRobotsTxtMiddleware):
    """Scrapy's middleware (one parsed robots.txt per host, kept for the crawl), with two changes:

    * the robots.txt request carries the site of the request that needed it, so it goes out
      with the site's headers, User-Agent and proxy like the site's other requests;
    * under the asyncio reactor, requests that arrive while robots.txt is still downloading all
      await the same Deferred, and turning it into a future consumes its result, so Scrapy lets
      all but the first of them through unchecked. Here each waiter gets its own copy.
    """

    async def robot_parser(self, request: Request) -> Any:
        netloc = urlparse_cached(request).netloc
        pending = self._parsers.get(netloc)
        if isinstance(pending, Deferred):
            waiter: Deferred[Any] = Deferred()

            def forward(result: Any) -> Any:
                waiter.callback(result)
                return result

            pending.addBoth(forward)
            return await maybe_deferred_to_future(waiter)
        if netloc in self._parsers:
            return self._parsers[netloc]
        self._parsers[netloc] = Deferred()
        url = urlparse_cached(request)
        meta: dict[str, Any] = {"dont_obey_robotstxt": True}
        site = site_of(request)
        if site is not None:
            meta[SITE_META_KEY] = site
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            # Retried here: the add-on turns Scrapy's RetryMiddleware off, and a dead proxy of
            # the site should not make the worker ignore its robots.txt.
            robotsreq = Request(f"{url.scheme}://{netloc}/robots.txt", dont_filter=True,
                                priority=self.DOWNLOAD_PRIORITY, meta=dict(meta),
                                callback=NO_CALLBACK)
            try:
                resp = await self.crawler.engine.download_async(robotsreq)
            except Exception as exc:
                if attempt < FETCH_ATTEMPTS and not isinstance(exc, IgnoreRequest):
                    logger.warning("Error downloading %s (attempt %d): %s", robotsreq, attempt,
                                   exc)
                    continue
                if not isinstance(exc, IgnoreRequest):
                    logger.error("Error downloading %(request)s: %(f_exception)s",
                                 {"request": robotsreq, "f_exception": exc})
                self._robots_error(exc, netloc)
            else:
                try:
                    await self._parse_robots(resp, netloc, request)
                except Exception as exc:  # never leave the waiters hanging
                    logger.error("Error parsing %s: %s", robotsreq, exc)
                    self._robots_error(exc, netloc)
            break
        self._stats.inc_value("robotstxt/request_count")
        return self._parsers[netloc]


# -- cookie warm-up ---------------------------------------------------------------------------


class CookieWarmupMiddleware(_SiteMiddleware):
    """Once per site and worker: GET the home page before the first real request goes out.

    The first request waits for the warm-up (concurrent first requests share it); the warm-up is
    not retried when it fails (logged, the real request goes on). Nothing is re-scheduled, so a
    crash mid-warm-up loses nothing: the task is simply redelivered.
    """

    def __init__(self, crawler: Any) -> None:
        super().__init__(crawler)
        self._done: set[str] = set()
        self._pending: dict[str, Any] = {}

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        found = self.config_for(request)
        if found is None or request.meta.get(SITE_META_KEY):
            return
        site, config = found
        if not config.cookie_warmup or site in self._done:
            return
        import asyncio

        future = self._pending.get(site)
        if future is None:
            future = asyncio.ensure_future(self._warm(site, request.url))
            self._pending[site] = future
        await asyncio.shield(future)

    async def _warm(self, site: str, url: str) -> None:
        parts = urlsplit(url)
        home = f"{parts.scheme}://{parts.netloc}/"
        try:
            for attempt in range(1, FETCH_ATTEMPTS + 1):
                warmup = Request(home, dont_filter=True, priority=100,
                                 meta={SITE_META_KEY: site, "handle_httpstatus_all": True})
                try:
                    response = await self.crawler.engine.download_async(warmup)
                except Exception as exc:  # e.g. a dead proxy: the next attempt picks another
                    logger.warning("Cookie warm-up for site %s: GET %s failed (attempt %d): %s",
                                   site, home, attempt, exc)
                    continue
                logger.info("Cookie warm-up for site %s: GET %s -> %s", site, home,
                            response.status)
                if self.stats is not None:
                    self.stats.inc_value(f"meteorseed/warmup/{site}")
                return
            # The real request goes on without the cookies.
        finally:
            self._done.add(site)
            self._pending.pop(site, None)


# -- User-Agent pool and site headers ---------------------------------------------------------


class UserAgentPoolMiddleware(_SiteMiddleware):
    def __init__(self, crawler: Any) -> None:
        super().__init__(crawler)
        self._turn: dict[str, int] = {}

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        found = self.config_for(request)
        if found is None:
            return
        site, config = found
        for name, value in config.headers.items():
            request.headers.setdefault(name, value)
        agents = config.user_agents
        if agents and b"User-Agent" not in request.headers:
            turn = self._turn.get(site, 0)
            self._turn[site] = turn + 1
            request.headers[b"User-Agent"] = agents[turn % len(agents)]


# -- proxy pool -------------------------------------------------------------------------------


@dataclass
class ProxyState:
    failures: int = 0  # in a row
    cooling_until: float = 0.0
    uses: int = 0
    total_failures: int = 0


class ProxyPool:
    """Failure scoring and rotation over proxy URLs (per worker).

    :meth:`pick` rotates round-robin over the proxies not cooling down with the fewest recent
    failures; when every proxy is cooling down it takes the one that comes back first.
    ``max_failures`` failures in a row put a proxy in cool-down for ``cooldown`` seconds; after
    that it gets one chance (a single failure sends it back); a success clears its score.
    """

    def __init__(self, max_failures: int = 3, cooldown: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures = max(1, max_failures)
        self.cooldown = cooldown
        self.clock = clock
        self.states: dict[str, ProxyState] = {}
        self._turn = 0

    def state(self, proxy: str) -> ProxyState:
        state = self.states.get(proxy)
        if state is None:
            state = self.states[proxy] = ProxyState()
        return state

    def pick(self, proxies: tuple[str, ...] | list[str]) -> str:
        if not proxies:
            raise ValueError("no proxies to pick from")
        now = self.clock()
        states = [(p, self.state(p)) for p in proxies]
        healthy = [(p, s) for p, s in states if s.cooling_until <= now]
        if not healthy:
            proxy = min(states, key=lambda ps: ps[1].cooling_until)[0]
        else:
            best = min(s.failures for _, s in healthy)
            candidates = [p for p, s in healthy if s.failures == best]
            proxy = candidates[self._turn % len(candidates)]
            self._turn += 1
        self.state(proxy).uses += 1
        return proxy

    def failure(self, proxy: str) -> bool:
        """Count a failure; ``True`` when the proxy now cools down."""
        state = self.state(proxy)
        state.failures += 1
        state.total_failures += 1
        if state.failures >= self.max_failures:
            state.cooling_until = self.clock() + self.cooldown
            state.failures = self.max_failures - 1  # after the cool-down: one more chance
            return True
        return False

    def success(self, proxy: str) -> None:
        state = self.state(proxy)
        state.failures = 0
        state.cooling_until = 0.0


def _safe(proxy: str) -> str:
    parts = urlsplit(proxy)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}" if parts.hostname else proxy


class ProxyPoolMiddleware(_SiteMiddleware):
    def __init__(self, crawler: Any) -> None:
        super().__init__(crawler)
        settings = crawler.settings
        self.pool = ProxyPool(settings.getint("METEORSEED_PROXY_MAX_FAILURES", 3),
                              settings.getfloat("METEORSEED_PROXY_COOLDOWN", 60.0))

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if "proxy" in request.meta:
            return  # chosen by the project (or by an earlier hop of this request)
        found = self.config_for(request)
        if found is None or not found[1].proxies:
            return
        proxy = self.pool.pick(found[1].proxies)
        request.meta["proxy"] = proxy
        request.meta[PROXY_META_KEY] = proxy

    def process_response(self, request: Request, response: Response,
                         spider: Spider | None = None) -> Response:
        proxy = request.meta.get(PROXY_META_KEY)
        if proxy is not None:
            if response.status == 407 or response.status >= 500:
                self._failed(request, proxy, f"HTTP {response.status}")
            else:
                self.pool.success(proxy)
        return response

    def process_exception(self, request: Request, exception: Exception,
                          spider: Spider | None = None) -> None:
        proxy = request.meta.get(PROXY_META_KEY)
        if proxy is not None and not isinstance(exception, IgnoreRequest):
            self._failed(request, proxy, type(exception).__name__)

    def _failed(self, request: Request, proxy: str, why: str) -> None:
        # The next attempt (a durable retry, a redirect hop) picks again.
        request.meta.pop("proxy", None)
        request.meta.pop(PROXY_META_KEY, None)
        if self.stats is not None:
            self.stats.inc_value("meteorseed/proxy/failures")
        if self.pool.failure(proxy):
            logger.warning("Proxy %s cools down for %.0fs after %s", _safe(proxy),
                           self.pool.cooldown, why)
            if self.stats is not None:
                self.stats.inc_value("meteorseed/proxy/cooldowns")


__all__ = ["BlacklistMiddleware", "CookieWarmupMiddleware", "ProxyPool", "ProxyPoolMiddleware",
           "RobotsTxtMiddleware", "SiteConfigs", "UserAgentPoolMiddleware", "site_config",
           "site_configs"]

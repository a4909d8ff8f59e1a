"""robots.txt per host, fetched with the headers, User-Agent and proxy of the site needing it."""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

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

from meteorseed_scrapy.politeness.gate import ROBOTS_CAP_REFRESH_S
from meteorseed_scrapy.politeness.runtime import CrawlRuntime
from meteorseed_scrapy.queue.plumbing.connection import REDIS_FAILURES
from meteorseed_scrapy.scrapy_internals import parse_robots, robots_error, robots_parsers
from meteorseed_scrapy.settings import integer_setting
from meteorseed_scrapy.sites.lookup import FETCH_ATTEMPTS, SITE_META_KEY, site_config, site_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)
#: Recording a robots.txt rate failed: Redis, or a value the gate refused.
CAP_FAILURES: tuple[type[Exception], ...] = (*REDIS_FAILURES, ValueError, TypeError)


class RobotsTxtMiddleware(ScrapyRobotsTxtMiddleware):
    """Scrapy's middleware (one parsed robots.txt per host, kept for the crawl), with two changes:

    * the robots.txt request carries the site of the request that needed it, so it goes out
      with the site's headers, User-Agent and proxy like the site's other requests;
    * under the asyncio reactor, requests that arrive while robots.txt is still downloading all
      await the same Deferred, and turning it into a future consumes its result, so Scrapy lets
      all but the first of them through unchecked. Here each waiter gets its own copy;
    * its ``Crawl-delay`` and ``Request-rate`` for the request's User-Agent cap the site's rate
      fleet-wide in a worker crawl (``SiteGate.cap_by_robots``, the crawl's runtime's gate),
      unless the site's rule config sets ``limits.ignore_crawl_delay`` (with its reason).
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self.runtime = CrawlRuntime.of(crawler)
        self.stats = crawler.stats
        self.parsers = robots_parsers(self)  # (Scrapy's: its parse and error settle them)
        self.robots_agent: str | None = crawler.settings["ROBOTSTXT_USER_AGENT"]
        self.default_agent: str = crawler.settings["USER_AGENT"]
        #: (site, host, User-Agent) -> monotonic time its robots.txt rate was recorded
        self._capped: dict[tuple[str, str, str], float] = {}

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if request.meta.get("dont_obey_robotstxt"):
            return
        if request.url.startswith("data:") or request.url.startswith("file:"):
            return
        rp = await self.robot_parser(request)
        if self.runtime.worker:
            await self._cap(rp, request)
        self.process_request_2(rp, request)

    def _useragent(self, request: Request) -> str:
        agent: Any = self.robots_agent or request.headers.get(
            b"User-Agent", self.default_agent) or ""
        return agent.decode("utf-8", "replace") if isinstance(agent, bytes) else str(agent)

    async def _cap(self, rp: Any, request: Request) -> None:
        """Record the robots.txt rate cap of the request's host for its site, once per site,
        host and User-Agent in this worker (its rule config may ignore it, with a reason)."""
        site = site_of(request)
        if site is None:
            return
        host, agent = urlparse_cached(request).netloc, self._useragent(request)
        seen, now = (site, host, agent), time.monotonic()
        if now - self._capped.get(seen, -math.inf) < ROBOTS_CAP_REFRESH_S:
            return
        self._capped[seen] = now  # before the await: requests in flight together ask once
        interval = robots_interval(rp, agent)
        try:
            capped = await self.runtime.gate.cap_by_robots(site, host, interval)
        except CAP_FAILURES as exc:
            del self._capped[seen]  # asked again with the site's next request
            logger.warning("Could not record the robots.txt rate of %s for site %s: %s", host,
                           site, exc)
            return
        if capped:
            logger.info("robots.txt of %s asks %.3gs between requests: site %s gets at most "
                        "%.3g requests/s from the whole fleet", host, interval, site,
                        1 / interval if interval else 0)
            self.stats.set_value(f"meteorseed/robots/interval_s/{site}", interval)
        elif interval:
            config = site_config(self.crawler, site)
            reason = config.limits.ignore_crawl_delay if config is not None else None
            logger.info("robots.txt of %s asks %.3gs between requests; site %s ignores it: %s",
                        host, interval, site, reason or "robots not obeyed")

    async def robot_parser(self, request: Request) -> Any:
        netloc = urlparse_cached(request).netloc
        pending = self.parsers.get(netloc)
        if isinstance(pending, Deferred):
            waiter: Deferred[Any] = Deferred()

            def forward(result: Any) -> Any:
                waiter.callback(result)
                return result

            pending.addBoth(forward)
            return await maybe_deferred_to_future(waiter)
        if netloc in self.parsers:
            return self.parsers[netloc]
        self.parsers[netloc] = Deferred()
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
                robots_error(self, exc, netloc)
            else:
                try:
                    await self.parse_capped(resp, netloc, request)
                except Exception as exc:  # never leave the waiters hanging
                    logger.error("Error parsing %s: %s", robotsreq, exc)
                    robots_error(self, exc, netloc)
            break
        self.stats.inc_value("robotstxt/request_count")
        return self.parsers[netloc]

    async def parse_capped(self, response: Response, netloc: str, request: Request) -> None:
        # Only the first METEORSEED_ROBOTSTXT_MAXSIZE bytes are rules (as Google reads them):
        # parsing a 50 MB file took ~15 s of the reactor and 900 MB.
        cap = integer_setting(self.crawler.settings, "METEORSEED_ROBOTSTXT_MAXSIZE", minimum=1)
        if len(response.body) > cap:
            logger.warning("robots.txt of %s is %d bytes: only its first %d are read"
                           " (METEORSEED_ROBOTSTXT_MAXSIZE)", netloc, len(response.body), cap)
            self.stats.inc_value("meteorseed/robots/truncated")
            response = response.replace(body=response.body[:cap])
        await parse_robots(self, response, netloc, request)


def robots_interval(rp: Any, agent: str) -> float | None:
    """Least seconds between two requests that robots.txt asks of ``agent``: its
    ``Crawl-delay`` or ``Request-rate`` (n requests per s seconds), the longer; None when it
    asks neither (or the parser, not Protego, cannot tell)."""
    parser = getattr(rp, "rp", None)
    if parser is None or not hasattr(parser, "crawl_delay"):
        return None
    found: list[float] = []
    try:
        delay = parser.crawl_delay(agent)
        rate = parser.request_rate(agent)
    except Exception:  # a robots.txt Protego cannot answer for: no cap rather than no crawl
        return None
    if isinstance(delay, (int, float)) and math.isfinite(delay) and delay > 0:
        found.append(float(delay))
    requests, seconds = getattr(rate, "requests", None), getattr(rate, "seconds", None)
    if isinstance(requests, int) and isinstance(seconds, (int, float)) and requests > 0 \
            and seconds > 0 and math.isfinite(seconds):
        found.append(float(seconds) / requests)
    return max(found) if found else None

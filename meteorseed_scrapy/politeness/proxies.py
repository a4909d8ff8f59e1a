"""Proxy pool per site: rotation over the site's ``proxies`` with failure scoring and cool-down."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

from meteorseed_scrapy.settings import DEFAULTS, duration_setting, integer_setting
from meteorseed_scrapy.sites.lookup import SiteMiddleware

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: meta key of the proxy the pool chose for a request
PROXY_META_KEY = "meteorseed_proxy"


@dataclass
class ProxyState:
    failures: int = 0  # in a row
    cooling_until: float = 0.0


class ProxyPool:
    """Failure scoring and rotation over proxy URLs (per worker).

    :meth:`pick` rotates round-robin over the proxies not cooling down with the fewest recent
    failures; when every proxy is cooling down it takes the one that comes back first.
    ``max_failures`` failures in a row put a proxy in cool-down for ``cooldown`` seconds; after
    that it gets one chance (a single failure sends it back); a success clears its score.
    """

    def __init__(self, max_failures: int = DEFAULTS["METEORSEED_PROXY_MAX_FAILURES"],
                 cooldown: float = DEFAULTS["METEORSEED_PROXY_COOLDOWN"],
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
        return proxy

    def failure(self, proxy: str) -> bool:
        """Count a failure; ``True`` when the proxy now cools down."""
        state = self.state(proxy)
        state.failures += 1
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


class ProxyPoolMiddleware(SiteMiddleware):
    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        settings = crawler.settings
        self.pool = ProxyPool(
            integer_setting(settings, "METEORSEED_PROXY_MAX_FAILURES", minimum=1),
            duration_setting(settings, "METEORSEED_PROXY_COOLDOWN"))

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


__all__ = ["PROXY_META_KEY", "ProxyPool", "ProxyPoolMiddleware", "ProxyState"]

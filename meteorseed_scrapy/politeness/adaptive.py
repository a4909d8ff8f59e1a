"""Scrapy's AutoThrottle for a whole fleet: each site's rate follows the latency every worker
observes, aiming at ``AUTOTHROTTLE_TARGET_CONCURRENCY`` requests in flight to the site in total.

Scrapy's AutoThrottle sets one delay per download slot of one process, so N workers send N
times the load asked for. Here the workers sum their responses' latencies locally
(:class:`LatencySamples`, fed by :class:`AdaptiveThrottleMiddleware`) and the permit loop
flushes the sums about once a second per site to ``lua/adaptive.lua``, which keeps one delay
per site (its quota) in Redis with Scrapy's rule: ``latency / target``, reached at once when
higher, halfway when lower, never lowered by a non-200 answer, kept within
[``DOWNLOAD_DELAY``, ``AUTOTHROTTLE_MAX_DELAY``] and starting at ``AUTOTHROTTLE_START_DELAY``.
``lua/gate.lua`` then grants the site's permits at ``1 / delay`` (at most its configured rate)
and at most ``2 * target`` at once (at most its configured concurrency); 429 pauses and the
breaker still act on top. docs/politeness.md tells the whole story.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.http import Response

from meteorseed_scrapy.task.context import task_of
from meteorseed_scrapy.validators import ConfigError, to_number

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy.crawler import Crawler

    from meteorseed_scrapy.politeness.runtime import CrawlRuntime

#: Seconds between two flushes of a worker's samples, and between two updates of a site's
#: delay in Redis (whichever worker's flush comes first after it).
FLUSH_INTERVAL_S = 1.0
#: A site's adaptive state is forgotten (it starts again at the start delay) after this long
#: without a response, as Scrapy forgets an idle download slot.
STATE_TTL_S = 600.0


@dataclass(frozen=True)
class AdaptiveTarget:
    """The ``AUTOTHROTTLE_*`` figures, fleet-wide: requests in flight aimed at, and the delay
    (seconds between two requests to the site from the whole fleet) it starts at and stays in."""

    target: float = 1.0
    start_delay: float = 5.0
    min_delay: float = 0.0
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        to_number(self.target, "AUTOTHROTTLE_TARGET_CONCURRENCY", positive=True,
                  maximum=10_000)
        to_number(self.start_delay, "AUTOTHROTTLE_START_DELAY", maximum=86_400)
        to_number(self.min_delay, "DOWNLOAD_DELAY", maximum=86_400)
        to_number(self.max_delay, "AUTOTHROTTLE_MAX_DELAY", positive=True, maximum=86_400)
        if self.max_delay < self.min_delay:
            raise ConfigError("AUTOTHROTTLE_MAX_DELAY", "must not be below DOWNLOAD_DELAY"
                              f" ({self.max_delay:g} < {self.min_delay:g})")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> AdaptiveTarget:
        def read(name: str, **bounds: Any) -> float:
            return to_number(settings.get(name), name, maximum=86_400, **bounds)

        low = read("DOWNLOAD_DELAY")
        high = read("AUTOTHROTTLE_MAX_DELAY", positive=True)
        # As Scrapy's AutoThrottle: it starts at max(DOWNLOAD_DELAY, START_DELAY).
        start = min(high, max(low, read("AUTOTHROTTLE_START_DELAY")))
        target = to_number(settings.get("AUTOTHROTTLE_TARGET_CONCURRENCY"),
                           "AUTOTHROTTLE_TARGET_CONCURRENCY", positive=True, maximum=10_000)
        return cls(target=target, start_delay=start, min_delay=low, max_delay=high)

    @property
    def concurrency(self) -> int:
        """Requests in flight the fleet may hold at once: twice the target, so a site that
        slows down at once holds no more than that while its rate comes down."""
        return max(1, math.ceil(2 * self.target))

    def args(self) -> list[Any]:
        """``lua/adaptive.lua``'s ARGV[5:9]: target, start/min/max delay (ms)."""
        return [self.target, round(self.start_delay * 1000, 3), round(self.min_delay * 1000, 3),
                round(self.max_delay * 1000, 3)]


class LatencySamples:
    """Responses per quota since the last flush: ``[n, latency ms, n of 200s, their ms]``."""

    def __init__(self) -> None:
        self._sums: dict[str, list[float]] = {}

    def __bool__(self) -> bool:
        return bool(self._sums)

    def add(self, quota: str, latency_s: float, good: bool) -> None:
        if not (isinstance(latency_s, (int, float)) and math.isfinite(latency_s)) \
                or latency_s < 0:
            return  # no usable figure: not a sample (Scrapy skips those too)
        sums = self._sums.setdefault(quota, [0, 0.0, 0, 0.0])
        ms = latency_s * 1000
        sums[0] += 1
        sums[1] += ms
        if good:
            sums[2] += 1
            sums[3] += ms

    def take(self) -> dict[str, list[float]]:
        taken, self._sums = self._sums, {}
        return taken

    def put_back(self, quota: str, sums: list[float]) -> None:
        """A flush Redis refused: the samples wait for the next one."""
        mine = self._sums.setdefault(quota, [0, 0.0, 0, 0.0])
        for i, value in enumerate(sums):
            mine[i] += value


@dataclass(frozen=True)
class AdaptiveState:
    """A site's fleet-wide adaptive state as ``lua/adaptive.lua`` keeps it."""

    delay_s: float  # between two requests from the whole fleet
    latency_s: float | None  # mean latency of the last window (None: none yet)

    @property
    def rate(self) -> float | None:
        return 1 / self.delay_s if self.delay_s > 0 else None


class AdaptiveThrottleMiddleware:
    """Feeds each response's ``download_latency`` and status to the fleet-wide adaptive limit
    of its site in a worker crawl (through the crawl's runtime's gate). Requests with
    ``autothrottle_dont_adjust_delay`` in their meta are left out, as in Scrapy."""

    def __init__(self, runtime: CrawlRuntime) -> None:
        self.runtime = runtime

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> AdaptiveThrottleMiddleware:
        # (imported here: the runtime's gate imports this module's samples)
        from meteorseed_scrapy.politeness.runtime import CrawlRuntime

        return cls(CrawlRuntime.of(crawler))

    def process_response(self, request: Request, response: Response,
                         spider: Spider | None = None) -> Response:
        task = task_of(request)
        latency = request.meta.get("download_latency")
        if task is not None and self.runtime.worker and latency is not None \
                and request.meta.get("autothrottle_dont_adjust_delay") is not True:
            self.runtime.gate.observe(task.site_id, latency, response.status)
        return response


__all__ = ["FLUSH_INTERVAL_S", "STATE_TTL_S", "AdaptiveState", "AdaptiveTarget",
           "AdaptiveThrottleMiddleware", "LatencySamples"]

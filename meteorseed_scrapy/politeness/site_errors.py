"""One site's politeness state failing in Redis is that site's trouble alone.

Corrupt state in a site's keys (a key of the wrong type, a value the scripts cannot read) makes
Redis refuse that site's gate, pause or breaker calls. The site's tasks then wait, retried with
a growing backoff, and the error is logged once (and once more when the site works again),
while every other site keeps its permits. Redis being away altogether is not a site's error:
those exceptions are left to the worker's outage handling. Nor is a Redis above its
``maxmemory`` refusing the call (it refuses every site's alike): that is reported to the
worker's one :class:`~meteorseed_scrapy.queue.plumbing.redis_full.RedisFull`, and the site
waits only the short while it says.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from meteorseed_scrapy.backoff import exponential
from meteorseed_scrapy.queue.plumbing.connection import out_of_memory
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

#: What a site's own state can make a call raise: Redis refusing the command or the script
#: (WRONGTYPE, a script error), or a reply of an unexpected shape.
SITE_ERRORS: tuple[type[Exception], ...] = (ResponseError, ValueError, TypeError, IndexError)

FIRST_WAIT_S = 1.0
MAX_WAIT_S = 60.0


class SiteFaults:
    """Per-site failure bookkeeping of one kind of call (``what``: "gate", "pause", ...);
    ``full``: the worker's view of a Redis refusing writes for want of memory (shared by
    every kind of call and the worker's loops; without one, a view of its own)."""

    def __init__(self, what: str, stats: StatsCollector, full: RedisFull | None = None) -> None:
        self.what = what
        self.stats = stats
        self.full = full or RedisFull(stats)
        self._where = f"{what} calls"  # (as RedisFull names the caller)
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}  # site -> monotonic time to try it again

    def failed(self, site: str, exc: BaseException) -> float:
        """Record a failed call for ``site``; returns how long its tasks should wait."""
        if out_of_memory(exc):
            wait = self.full.failed(exc, self._where)
            self._retry_at[site] = time.monotonic() + wait
            return wait
        n = self._failures.get(site, 0) + 1
        self._failures[site] = n
        self.stats.inc_value(f"meteorseed/{self.what}/{site}/errors")
        if n == 1:
            # Once per failing spell: a corrupt key fails every call, for as long as it lasts.
            logger.error(
                "The %s call of site %s failed: %s: %s. Its tasks wait (retried with backoff, "
                "not logged again until it works); other sites go on",
                self.what, site, type(exc).__name__, exc,
                exc_info=not isinstance(exc, ResponseError),
            )
        else:
            logger.debug("The %s call of site %s failed again (%d): %s", self.what, site, n, exc)
        wait = exponential(n - 1, FIRST_WAIT_S, MAX_WAIT_S)
        self._retry_at[site] = time.monotonic() + wait
        return wait

    def ok(self, site: str) -> None:
        """A call for ``site`` worked. (That proves no room in a full Redis: a call whose only
        write was a deletion goes through it. The worker's loops tell when there is.)"""
        n = self._failures.pop(site, None)
        self._retry_at.pop(site, None)
        if n:
            logger.warning("The %s call of site %s works again, after %d failed call(s)",
                           self.what, site, n)

    def blocked(self, site: str) -> float:
        """Seconds before ``site`` should be tried again (0: now)."""
        at = self._retry_at.get(site)
        return 0.0 if at is None else max(0.0, at - time.monotonic())

    def failing(self) -> list[str]:
        return sorted(self._failures)

"""Redis refusing writes for want of memory, as one worker sees it.

Redis above its ``maxmemory`` (with ``noeviction``) refuses every write alike: the worker's
loops, its gate, breaker and pause calls, its last writes on the way out. That is one condition
of the server, not of a loop or a site, so a worker holds one :class:`RedisFull` (built with its
crawl's runtime) that every caller reports to: one warning from the first refusal, one when
the worker finds room again (its loops ask Redis, ``worker/loops.py``: a call that went
through proves nothing, as one whose only write is a deletion goes through a full Redis), a
short wait meanwhile (room can come back at any time), and the stat ``meteorseed/redis/full``
counting the refusals.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from meteorseed_scrapy.backoff import exponential

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)


class RedisFull:
    #: The longest wait (s) before a refused call is tried again.
    MAX_DELAY_S = 1.0

    def __init__(self, stats: StatsCollector | None) -> None:
        self.stats = stats
        self.refused: set[str] = set()  # the callers whose last call an OOM refused
        self.failures = 0  # refusals since Redis last had room

    def failed(self, exc: BaseException, where: str) -> float:
        """``where``'s call was refused for want of memory: seconds to wait before its next."""
        if self.stats is not None:
            self.stats.inc_value("meteorseed/redis/full")
        if not self.refused:
            logger.warning("Redis is full (above its maxmemory) during %s: what it refuses"
                           " waits, nothing is lost; retrying (%s)", where, exc)
        else:
            logger.debug("Redis still full during %s: %s", where, exc)
        self.refused.add(where)
        self.failures += 1
        return exponential(self.failures, 0.25, self.MAX_DELAY_S, jitter=(0.8, 1.0))

    def room(self) -> None:
        """Redis is below its ``maxmemory`` again (said once per spell)."""
        if not self.refused:
            return
        logger.warning("Redis has room again after %d refused writes: worker resumed",
                       self.failures)
        self.refused.clear()
        self.failures = 0


__all__ = ["RedisFull"]

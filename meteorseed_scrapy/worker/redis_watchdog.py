"""How long a worker waits for a Redis it cannot reach.

The worker's loops pause through a Redis outage and lose nothing (:mod:`.loops`), which is right
for a long-running worker, but a batch worker (``METEORSEED_IDLE_CLOSE`` > 0) would wait for
ever: its idle close needs Redis to say that nothing is left. So a batch worker that cannot
reach Redis for :func:`give_up_after` seconds, from its start or later, ends its crawl with a
line naming the (redacted) URL and how to start a Redis, and exits with
:data:`~meteorseed_scrapy.exit_codes.EXIT_ERROR`; a long-running one keeps waiting and says so
once a minute.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from meteorseed_scrapy.exit_codes import EXIT_ERROR
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.store.outage import CrawlStop
from meteorseed_scrapy.validators import format_duration

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: A batch worker waits at least this long (s) for Redis before it gives up.
MIN_WAIT_S = 30.0
#: Seconds between two "still waiting" lines of a long-running worker.
REMIND_EVERY_S = 60.0
#: Seconds between two looks at Redis.
PING_EVERY_S = 1.0
REASON = "redis_unreachable"
HOW_TO_START = ("start one with `meteorseed redis --dir ./redis-data` (see the README's "
                "Install section), or point METEORSEED_REDIS_URL at yours")


class Pingable(Protocol):
    def ping(self) -> Awaitable[Any]: ...


def give_up_after(idle_close: float) -> float:
    """Seconds without Redis after which a batch worker ends: ``max(30 s, IDLE_CLOSE)``;
    ``0`` (never) for a long-running one (``IDLE_CLOSE = 0``)."""
    return max(MIN_WAIT_S, idle_close) if idle_close > 0 else 0.0


class RedisWatchdog:
    """Pings Redis every second; what to do when it has not answered for a while."""

    def __init__(self, crawler: Crawler, redis: Pingable, url: str, idle_close: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.crawler = crawler
        self.redis = redis
        self.url = redact(url)
        self.idle_close = idle_close
        self.bound = give_up_after(idle_close)
        self.clock = clock
        # (not awaited: closing the spider cancels this watchdog, a chore of the scheduler)
        self._stop = CrawlStop(crawler, REASON, "meteorseed/redis/gave_up", logger,
                               exit_code=EXIT_ERROR)

    async def run(self) -> None:
        reminded = self.clock()
        down_since: float | None = reminded  # until Redis first answers
        while True:
            try:
                await self.redis.ping()
                down_since = None
            except REDIS_DOWN as exc:
                now = self.clock()
                down_since = now if down_since is None else down_since
                waited = now - down_since
                if self.bound and waited >= self.bound:
                    self._give_up(waited, exc)
                    return
                if not self.bound and now - reminded >= REMIND_EVERY_S:
                    reminded = now
                    logger.warning(
                        "Still waiting for Redis at %s, unreachable for %s (%s): this worker "
                        "(METEORSEED_IDLE_CLOSE = 0) waits as long as it takes; %s",
                        self.url, format_duration(waited), exc, HOW_TO_START)
            await asyncio.sleep(PING_EVERY_S)

    def _give_up(self, waited: float, exc: BaseException) -> None:
        self._stop.stop(
            f"Redis at {self.url} unreachable for {format_duration(waited)} ({exc}): a batch "
            f"worker (METEORSEED_IDLE_CLOSE = {format_duration(self.idle_close)}) waits at most "
            f"{format_duration(self.bound)} for it, closing; {HOW_TO_START}")

    @property
    def gave_up(self) -> bool:
        return self._stop.stopped


__all__ = ["REASON", "RedisWatchdog", "give_up_after"]

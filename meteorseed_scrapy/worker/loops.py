"""The worker's background loops: each runs its step over and over until the worker stops.

Redis going away pauses a loop (one log line per outage, exponential backoff) and never drops
what is queued. So does a Redis above its ``maxmemory`` (policy ``noeviction``) that refuses a
loop's writes with an OOM, while it still answers reads: it is full (the worker's one
:class:`~meteorseed_scrapy.queue.plumbing.redis_full.RedisFull`, which its site calls tell
too) until a loop's step goes through with Redis below its ``maxmemory`` (room made by acks
elsewhere, or by its operator). A consumer group that vanished is created again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from meteorseed_scrapy.backoff import exponential
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.fleet.snapshot import RedisMemory
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN, out_of_memory
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
from meteorseed_scrapy.worker.stall import StallWatch

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)


class Outage:
    """Shared view of Redis availability: one warning per outage, exponential backoff."""

    #: A failure this soon (s) after Redis came back is the outage's tail (a command sent
    #: before it ended, failing now): the same outage, not a new one to log.
    TAIL_S = 5.0

    def __init__(self, stalls: StallWatch | None = None) -> None:
        self.stalls = stalls or StallWatch()
        self.since: float | None = None
        self.failures = 0
        self._back: tuple[float, float] | None = None  # (when it came back, outage start)
        self._tail = False
        self.back = asyncio.Event()  # set when Redis answers again: wakes the loops' back-off

    def failed(self, exc: BaseException, where: str) -> float:
        self.failures += 1
        delay = exponential(self.failures, 0.25, 30.0, jitter=(0.8, 1.2))
        if self.since is None:
            self.back.clear()
            now = time.monotonic()
            if self._back is not None and now - self._back[0] < self.TAIL_S:
                self.since, self._tail = self._back[1], True
                logger.debug("Redis failed again right after coming back, during %s: %s",
                             where, exc)
                return delay
            self.since, self._tail = now, False
            stall = self.stalls.explains(now)
            if stall is not None:  # the loop was blocked, Redis was not gone (stall.py)
                logger.info("Redis timed out during %s after the event loop was blocked for"
                            " %.1f s (%s); retrying", where, stall, exc)
                return delay
            logger.warning(
                "Redis unavailable during %s (%s): worker paused, nothing is lost; retrying",
                where, exc,
            )
        else:
            logger.debug("Redis still unavailable during %s: %s", where, exc)
        return delay

    def ok(self) -> None:
        if self.since is not None:
            (logger.debug if self._tail else logger.warning)(
                "Redis is back after %.1fs: worker resumed", time.monotonic() - self.since
            )
            self._back = (time.monotonic(), self.since)
            self.back.set()
        self.since = None
        self.failures = 0


class Loops:
    """Runs the worker's steps as asyncio tasks, each after the consumer group is set up."""

    #: While Redis is full, ask it whether it has room at most this often (s): the ack loop
    #: steps up to twenty times a second, and a fleet's every worker asks.
    ROOM_CHECK_S = 0.25

    def __init__(self, consumer: StreamConsumer, stats: StatsCollector, full: RedisFull) -> None:
        self.consumer = consumer
        self.stats = stats
        self.outage = Outage()
        self.full = full
        self.stopping = False
        self._ready = False
        # One set-up at a time: a loop that set the group up late (under load, after a FLUSHALL
        # of the namespace) would create it again silently, and the tasks it took with it would
        # look taken over instead of lost (RedisWatch).
        self._setting_up = asyncio.Lock()
        self._checked = False
        self._full_until = 0.0  # (monotonic) Redis was full when last asked: not before then
        self.tasks: list[asyncio.Task[None]] = []
        #: Told of every command Redis refuses (an OOM, a vanished group) before it is handled.
        self.on_refused: Callable[[ResponseError], Awaitable[object]] | None = None

    def start(self, step: Callable[[], Awaitable[object]], where: str,
              event: asyncio.Event | None = None,
              urgent: Callable[[], bool] | None = None) -> None:
        """Run ``step`` until stopped; with ``event``, wait for it between steps (at most 1 s,
        or 0.05 s while ``urgent()``)."""
        self.outage.stalls.start()  # (once: a blocked loop is told from a Redis outage)
        self.tasks.append(asyncio.ensure_future(self._run(step, where, event, urgent)))

    async def cancel(self) -> None:
        self.outage.stalls.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.full.refused:  # (stopped before a loop found room: said here)
            with contextlib.suppress(*REDIS_DOWN, ResponseError):
                if await self._has_room(""):
                    self.full.room()

    async def _run(self, step: Callable[[], Awaitable[object]], where: str,
                   event: asyncio.Event | None, urgent: Callable[[], bool] | None) -> None:
        while not self.stopping:
            try:
                if not self._ready:
                    await self._setup()
                await step()
                if self.outage.since is not None:
                    # A step can succeed without Redis (nothing to send): only Redis answering
                    # ends an outage, else a partition logs "back"/"unavailable" over and over.
                    await self.consumer.redis.ping()
                self.outage.ok()
                if self.full.refused and await self._has_room(where):
                    self.full.room()
            except REDIS_DOWN as exc:
                self.stats.inc_value("meteorseed/redis/errors")
                delay = self.outage.failed(exc, where)
                # Woken when another loop finds Redis back: else this loop's own back-off (up
                # to 30 s) keeps it, the acks say, waiting long after the outage ended.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.outage.back.wait(), delay)
                continue
            except ResponseError as exc:
                if self.on_refused is not None:
                    await self.on_refused(exc)  # (an evicting policy stops the worker)
                if out_of_memory(exc):
                    await asyncio.sleep(self.full.failed(exc, where))
                    continue
                if "NOGROUP" not in str(exc):
                    logger.exception("Redis refused a command in the %s loop; continuing", where)
                    await asyncio.sleep(1.0)
                    continue
                # The stream or group vanished (a Redis restart without persistence, a reset):
                # create it again rather than spin on the error.
                logger.warning("Consumer group %r is gone (%s): creating it again",
                               self.consumer.keys.group, exc)
                self._ready = False
                await asyncio.sleep(0.5)
                continue
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Unexpected error in the %s loop; continuing", where)
                await asyncio.sleep(1.0)
                continue
            if event is None:
                # A step that finished without suspending (nothing to do, an answer already
                # buffered) must not let this loop starve the reactor: yield once per round.
                await asyncio.sleep(0)
            else:
                timeout = 0.05 if urgent is not None and urgent() else 1.0
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout)
                event.clear()

    async def _has_room(self, where: str) -> bool:
        """Whether Redis is below its ``maxmemory`` again, after ``where``'s step went through
        ("": none, the worker is stopping, and Redis is asked whenever it last answered). A
        step proves nothing by itself (one that wrote nothing, a site call that only deleted,
        goes through a full Redis), so ``INFO memory`` says, at most every
        :attr:`ROOM_CHECK_S`; where Redis will not say (INFO renamed away), a step that Redis
        had refused going through does."""
        now = time.monotonic()
        if where and now < self._full_until:
            return False
        try:
            memory = RedisMemory.parse(await self.consumer.redis.info("memory"))
        except ResponseError:
            memory = None
        if memory is None:
            return not where or where in self.full.refused
        if memory.full:
            self._full_until = now + self.ROOM_CHECK_S
        return not memory.full

    async def _setup(self) -> None:
        async with self._setting_up:
            if self._ready:  # (another loop did it meanwhile)
                return
            await self.consumer.ensure_group()
            if not self._checked:
                self._checked = True
                for warning in await self.consumer.membership().check_durability():
                    logger.warning("%s", warning)
            self._ready = True

"""A Redis that can lose this worker's keys, seen while the worker runs, not only at its start.

- **Eviction.** Every :data:`CHECK_S` seconds, and at once when Redis answers ``OOM``, ``INFO
  memory`` says the ``maxmemory-policy``. An ``allkeys-*`` policy with a ``maxmemory`` lets Redis
  evict the task streams themselves: tasks vanish without a trace while the worker acks the rest
  as if all were well. The worker stops (reason :data:`REASON`, stat
  ``meteorseed/redis/evicting``, exit code 1) with one error line naming the policy and the fix;
  its tasks stay pending. A ``volatile-*`` policy evicts only keys with an expiry (leases,
  pauses, completion records: no task is lost), and ``allkeys-*`` without a ``maxmemory``
  evicts nothing: one warning each.
- **Loss.** A task stream or its consumer group that vanished under the worker (Redis answers
  ``NOGROUP``: a FLUSHALL, a restart without persistence, an eviction) took the entries pending
  on this worker there with it. They are reported as lost (how many, one error line, stat
  ``meteorseed/redis/lost``) and forgotten, so that they are not reported later as "taken over
  by another worker" once the group is created again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.consume.delivery import Ref
from meteorseed_scrapy.queue.fleet.snapshot import RedisMemory
from meteorseed_scrapy.queue.plumbing.connection import REDIS_FAILURES, out_of_memory
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.store.outage import CrawlStop

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from meteorseed_scrapy.queue.consume.consumer import StreamConsumer

logger = logging.getLogger(__name__)

CHECK_S = 5.0
REASON = "meteorseed_redis_evicts"


class HeldTasks(Protocol):
    """The tasks this worker holds (the pump's), as the watch sees them."""

    def held_refs(self) -> list[Ref]: ...

    def lost(self, ref: Ref) -> None: ...


class RedisWatch:
    def __init__(self, crawler: Crawler, consumer: StreamConsumer, holder: HeldTasks) -> None:
        self.consumer = consumer
        self.holder = holder
        self.stats = crawler.stats
        self._stop = CrawlStop(crawler, REASON, "meteorseed/redis/evicting", logger)
        self._said = ""  # the policy last reported (each one said once)
        self._reported: set[Ref] = set()

    async def step(self) -> None:
        """One check, then the wait until the next (run by the worker's loops)."""
        await self.check()
        await asyncio.sleep(CHECK_S)

    async def check(self) -> None:
        if self._said == "unknown":
            return
        try:
            memory = RedisMemory.parse(await self.consumer.redis.info("memory"))
        except ResponseError as exc:  # (INFO renamed or refused on a managed Redis)
            memory, problem = None, str(exc)
        else:
            problem = "INFO memory has no readable maxmemory"
        if memory is None:
            self._said = "unknown"
            logger.warning("Cannot watch Redis's maxmemory-policy (%s): make sure it is "
                           "'noeviction'", problem)
            return
        policy, maxmemory = memory.policy, memory.max_bytes
        said = f"{policy}/{bool(maxmemory)}"
        if said == self._said:
            return
        self._said = said
        if policy.startswith("allkeys-") and maxmemory:
            self._stop.stop(
                f"Redis maxmemory-policy is {policy!r} with maxmemory {maxmemory}: Redis may "
                "evict this namespace's task streams, and their tasks would vanish. Stopping "
                "this worker (its tasks stay pending): set maxmemory-policy to 'noeviction'")
        elif policy.startswith(("allkeys-", "volatile-")):
            logger.warning(
                "Redis maxmemory-policy is %r: it may evict %s; set it to 'noeviction'", policy,
                "every key once a maxmemory is set" if policy.startswith("allkeys-")
                else "keys with an expiry (leases, pauses, completion records)")

    async def refused(self, exc: ResponseError) -> None:
        """What a loop's Redis command was refused with: an OOM has the policy checked now,
        a vanished stream or group has the entries this worker held there reported lost."""
        text = str(exc)
        try:
            if out_of_memory(exc):
                await self.check()
            elif "NOGROUP" in text:
                await self.vanished()
        except REDIS_FAILURES as trouble:  # (the loop's own handling goes on)
            logger.debug("Could not look into %r: %s", text, trouble)

    async def vanished(self) -> int:
        """Report (and forget) held entries whose stream or group is gone; how many."""
        refs = [ref for ref in self.holder.held_refs() if ref not in self._reported]
        streams = sorted({stream for stream, _ in refs})
        if not streams:
            return 0
        group = self.consumer.keys.group
        async with self.consumer.redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xinfo_groups(stream)
            replies = await pipe.execute(raise_on_error=False)
        gone = {stream for stream, reply in zip(streams, replies, strict=True)
                if isinstance(reply, ResponseError)  # no such key
                or (isinstance(reply, list)
                    and group not in (text_of(g.get("name", b"")) for g in reply))}
        # (Re-filtered: another loop may have reported them while this one awaited Redis.)
        lost = [ref for ref in refs if ref[0] in gone and ref not in self._reported]
        if not lost:
            return 0
        self._reported.update(lost)
        for ref in lost:
            self.holder.lost(ref)
        if self.stats is not None:
            self.stats.inc_value("meteorseed/redis/lost", len(lost))
        logger.error(
            "Redis lost %d task message(s) pending on this worker: stream(s) %s or their "
            "consumer group %r vanished (a FLUSHALL, a restart without persistence, or an "
            "eviction); those tasks are gone from Redis, seed them again", len(lost),
            ", ".join(sorted(gone)), group)
        return len(lost)


__all__ = ["CHECK_S", "REASON", "RedisWatch"]

"""The consumer group seen as a whole: its creation, who is listed in it, and whether the
namespace is quiet and safely kept.

A worker sets the group up, leaves it (and the live-worker registry) when it stops, and prunes
the consumers that crashed; it asks whether any task is left anywhere before it calls a run
finished, and warns at start of Redis settings that can lose tasks. Every method is one round
trip (or one per check) on a ``redis.asyncio`` client created with ``decode_responses=True``.
Nothing here knows about Scrapy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.fleet.liveness import Liveness
from meteorseed_scrapy.queue.fleet.spiders import register_worker
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.reads import Batch, Plan, call, run_async
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.queue.shards import check_shard_count

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

__all__ = ["ConsumerGroup"]

logger = logging.getLogger(__name__)



def quiet_plan(keys: KeyLayout) -> Plan[bool]:
    """True when no task waits in any stream, is pending on any consumer (entries are XDEL'd
    on ack) or is deferred in a delayed set: the cheap part of
    :func:`~meteorseed_scrapy.queue.inspect.status.status_plan` that a
    worker's idle check repeats every tick."""
    calls = [call("xlen", s) for s in keys.streams]
    calls += [call("zcard", d) for shard in keys.shard_keys for d in shard.delayeds]
    (replies,) = yield [Batch(calls)]
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return not any(int(r or 0) for r in replies)

class ConsumerGroup:
    """The group of every task stream of ``keys``, as seen by the consumer named ``consumer``."""

    def __init__(self, redis: AsyncRedis, keys: KeyLayout, consumer: str,
                 spider: str | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.consumer = consumer
        self.spider = spider  # the worker's spider, listed in <ns>:spiders:workers
        self.streams = keys.streams

    async def ensure(self) -> None:
        """Create the consumer group of every task stream (from its start) unless it exists,
        and record the shard count (or refuse a different one: :class:`ShardMismatch`)."""
        await check_shard_count(self.redis, self.keys)
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xgroup_create(stream, self.keys.group, id="0", mkstream=True)
            replies = await pipe.execute(raise_on_error=False)
        if self.spider is not None:
            await register_worker(self.redis, self.keys, self.consumer, self.spider)
        for reply in replies:
            if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
                raise reply

    async def leave(self) -> int:
        """Remove this consumer from the group of every stream where it holds nothing pending
        (a graceful stop after its hand-back): otherwise every worker process ever started
        stays listed. A stream where it still holds entries keeps it, or they could never be
        reclaimed. Leaves the live-worker registry too (:meth:`Liveness.leave`). Returns how
        many streams it left."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xpending_range(stream, self.keys.group, "-", "+", 1,
                                    consumername=self.consumer)
            held = await pipe.execute(raise_on_error=False)
        empty = [s for s, reply in zip(self.streams, held, strict=True)
                 if isinstance(reply, list) and not reply]
        holding = any(isinstance(reply, list) and reply for reply in held)
        try:
            await Liveness(self.redis, self.keys, self.consumer).leave(holding=holding)
            if not holding:
                await self.redis.hdel(self.keys.spider_workers, self.consumer)
        except ResponseError as exc:  # (a registry key of another type: never listed)
            logger.debug("Could not leave the live-worker registry: %s", exc)
        if not empty:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in empty:
                pipe.xgroup_delconsumer(stream, self.keys.group, self.consumer)
            await pipe.execute(raise_on_error=False)
        return len(empty)

    async def prune(self, min_idle_s: float) -> list[str]:
        """Remove consumers that hold nothing and were not seen for ``min_idle_s`` (workers that
        crashed, or stopped after handing tasks back that others took over). A live worker
        reads every fraction of a second, so it is never idle that long; one that holds
        entries is kept whatever its idle time, or they could not be reclaimed."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xinfo_consumers(stream, self.keys.group)
            listed = await pipe.execute(raise_on_error=False)
        gone: list[tuple[str, str]] = []
        for stream, consumers in zip(self.streams, listed, strict=True):
            if isinstance(consumers, list):
                gone += [(stream, str(c["name"])) for c in consumers
                         if int(c["pending"]) == 0 and int(c["idle"]) >= min_idle_s * 1000
                         and str(c["name"]) != self.consumer]
        if gone:
            async with self.redis.pipeline(transaction=False) as pipe:
                for stream, name in gone:
                    pipe.xgroup_delconsumer(stream, self.keys.group, name)
                await pipe.execute(raise_on_error=False)
            await self._forget_spiders(sorted({name for _, name in gone}))
        return sorted({name for _, name in gone})

    async def _forget_spiders(self, names: list[str]) -> None:
        """Drop pruned consumers from ``<ns>:spiders:workers``, except those of another spider:
        they may still hold tasks of its set, which this worker does not see; their own
        spider's workers drop them (take-over leaves them to those: ``StreamConsumer``)."""
        spiders = await self.redis.hmget(self.keys.spider_workers, names)
        mine = [name for name, spider in zip(names, spiders, strict=True)
                if spider is not None and text_of(spider) == (self.spider or "")]
        if mine:
            await self.redis.hdel(self.keys.spider_workers, *mine)

    async def namespace_quiet(self) -> bool:
        """True when no task waits in any stream, is pending on any consumer or is deferred
        in a delayed set (read as :mod:`meteorseed_scrapy.queue.inspect.status` reads the queue)."""
        return await run_async(self.redis, quiet_plan(self.keys))

    async def check_durability(self) -> list[str]:
        """Warnings about Redis settings that can lose tasks (empty when all is well)."""
        warnings: list[str] = []
        try:
            policy = (await self.redis.config_get("maxmemory-policy")).get("maxmemory-policy")
            aof = (await self.redis.config_get("appendonly")).get("appendonly")
            save = (await self.redis.config_get("save")).get("save")
        except ResponseError as exc:  # CONFIG disabled on managed Redis
            return [f"cannot check Redis persistence settings ({exc})"]
        if policy and policy != "noeviction":
            warnings.append(
                f"Redis maxmemory-policy is {policy!r}: under memory pressure Redis may evict "
                "task streams; set it to 'noeviction'"
            )
        if aof != "yes" and not save:
            warnings.append(
                "Redis persistence is off (appendonly no, no RDB save points): a Redis restart "
                "loses every task; enable appendonly"
            )
        return warnings

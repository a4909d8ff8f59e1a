"""The worker's side of the task streams: read, reclaim, keep alive, ack, dead-letter, hand back.

Every method is one round trip (a command, a pipeline or one Lua script) on a ``redis.asyncio``
client created with ``decode_responses=True``. Every delivery names the stream (lane and band)
it came from, and everything done to it later goes to that stream. Nothing here knows about
Scrapy.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from meteorseed_scrapy import scripts
from meteorseed_scrapy.keys import BANDS, KeyLayout
from meteorseed_scrapy.streams.lanes import DEFAULT_WEIGHTS, LaneShares, LaneWeights
from meteorseed_scrapy.tasks import ExecTask, TaskError

logger = logging.getLogger(__name__)


#: A message in a task stream: ``(stream key, message id)``. Ids are unique per stream only.
Ref = tuple[str, str]


@dataclass(frozen=True)
class Delivery:
    """One stream entry as delivered to this consumer; ``task`` is None when it is malformed."""

    stream: str
    msg_id: str
    fields: Mapping[str, str]
    deliveries: int
    task: ExecTask | None = None
    error: str = ""

    @property
    def ref(self) -> Ref:
        return (self.stream, self.msg_id)

    @classmethod
    def decode(cls, stream: str, msg_id: str, fields: Mapping[str, str] | None,
               deliveries: int) -> Delivery:
        fields = fields or {}
        try:
            return cls(stream, msg_id, fields, deliveries, ExecTask.from_message(fields))
        except TaskError as exc:
            return cls(stream, msg_id, fields, deliveries, None, f"malformed message: {exc}")


def by_stream(refs: Sequence[Ref]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for stream, msg_id in refs:
        out.setdefault(stream, []).append(msg_id)
    return out


class StreamConsumer:
    """Reads every task stream of ``keys`` (lanes x bands) as one consumer of the group."""

    def __init__(self, redis: Any, keys: KeyLayout, consumer: str,
                 weights: LaneWeights | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.consumer = consumer
        self.streams = keys.streams
        self._index = {stream: i for i, stream in enumerate(self.streams, start=1)}
        self.shares = LaneShares(weights or LaneWeights.parse(DEFAULT_WEIGHTS))
        self._read = scripts.register(redis, "read")
        self._dead = scripts.register(redis, "dead")
        self._touch = scripts.register(redis, "touch")
        self._handback = scripts.register(redis, "handback")
        self._reclaim = scripts.register(redis, "reclaim")
        self._reclaim_cursors = ["0-0"] * len(self.streams)

    def lane_of(self, delivery: Delivery) -> str:
        """The lane whose stream ``delivery`` came from (not the task's own: a retry of a
        realtime task waits in the retry lane)."""
        return self.keys.stream_lanes[delivery.stream][0]

    async def ensure_group(self) -> None:
        """Create the consumer group of every task stream (from its start) unless it exists."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xgroup_create(stream, self.keys.group, id="0", mkstream=True)
            replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
                raise reply

    async def read(self, count: int, block_ms: int) -> list[Delivery]:
        """Up to ``count`` new entries, shared between the lanes by weight (one script call);
        when every stream is empty, one blocking XREADGROUP over all of them, so an idle
        worker wakes as soon as a task arrives in any lane."""
        shares = self.shares.split(count)
        reply = await self._read(
            keys=self.streams,
            args=[self.keys.group, self.consumer, len(BANDS), *self.shares.weights, *shares],
        )
        if not reply and block_ms > 0:
            # (Several streams filled at the same instant may give up to count each.)
            reply = await self.redis.xreadgroup(
                self.keys.group, self.consumer, dict.fromkeys(self.streams, ">"),
                count=count, block=block_ms,
            )
        out: list[Delivery] = []
        for stream, entries in reply or []:
            for msg_id, fields in entries:
                if isinstance(fields, list):  # from the script: a flat field list
                    fields = dict(zip(fields[::2], fields[1::2], strict=True))
                out.append(Delivery.decode(stream, msg_id, fields, 1))
        return out

    async def reclaim(self, min_idle_s: float, count: int) -> list[Delivery]:
        """Entries idle for ``min_idle_s`` on any consumer (dead workers, failed tasks)."""
        cursors, entries = await self._reclaim(
            keys=self.streams,
            args=[self.keys.group, self.consumer, int(min_idle_s * 1000), count,
                  *self._reclaim_cursors],
        )
        self._reclaim_cursors = [str(c) for c in cursors]
        out = []
        for index, msg_id, flat, deliveries in entries:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            out.append(Delivery.decode(self.streams[int(index) - 1], msg_id, fields,
                                       int(deliveries)))
        return out

    async def touch(self, refs: Sequence[Ref]) -> list[Ref]:
        """Reset the idle time of our pending entries; returns those that are no longer ours."""
        if not refs:
            return []
        args: list[Any] = [self.keys.group, self.consumer]
        for stream, msg_id in refs:
            args += [self._index[stream], msg_id]
        lost = await self._touch(keys=self.streams, args=args)
        return [(self.streams[int(index) - 1], str(msg_id)) for index, msg_id in lost]

    async def hand_back(self, deliveries: Sequence[Delivery], idle_s: float) -> int:
        if not deliveries:
            return 0
        args: list[Any] = [self.keys.group, self.consumer, int(idle_s * 1000)]
        for d in deliveries:
            args += [self._index[d.stream], d.msg_id, max(0, d.deliveries - 1)]
        return int(await self._handback(keys=self.streams, args=args))

    async def record_completions(self, records: Sequence[tuple[str, str]], ttl: int) -> None:
        """Write ``(task_id, record JSON)`` completion records, before the tasks are acked.

        A task redelivered after a crash between this write and its ack is then acked
        without a refetch (and so is a duplicate message of a task that is already done).
        """
        await self.complete(records, (), ttl)

    async def ack(self, refs: Sequence[Ref]) -> int:
        """XACK then XDEL (so XLEN = waiting + pending); returns how many were still pending."""
        return await self.complete((), refs, 0)

    async def complete(self, records: Sequence[tuple[str, str]], refs: Sequence[Ref],
                       ttl: int) -> int:
        """Completion records first, then XACK and XDEL of ``refs``: one round trip.

        Commands of a pipeline run in order, so no entry is acked before the records sent
        with it are written, and no entry is deleted before it is acked.
        """
        streams = by_stream(refs)
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id, record in records:
                pipe.set(self.keys.done(task_id), record, ex=ttl)
            for stream, msg_ids in streams.items():
                pipe.xack(stream, self.keys.group, *msg_ids)
                pipe.xdel(stream, *msg_ids)
            if not len(pipe):
                return 0
            replies = await pipe.execute()
        return sum(int(n) for n in replies[len(records)::2])

    async def completion_records(self, task_ids: Sequence[str]) -> list[str | None]:
        if not task_ids:
            return []
        return list(await self.redis.mget([self.keys.done(t) for t in task_ids]))

    async def note_failures(self, failures: Sequence[tuple[str, str]], ttl: int) -> None:
        """Remember why tasks failed, so the dead letter of a task that keeps failing says why."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id, reason in failures:
                pipe.set(self.keys.failed(task_id), reason[:2000], ex=ttl)
            await pipe.execute()

    async def failure_notes(self, task_ids: Sequence[str]) -> dict[str, str]:
        if not task_ids:
            return {}
        notes = await self.redis.mget([self.keys.failed(t) for t in task_ids])
        return {t: n for t, n in zip(task_ids, notes, strict=True) if n}

    async def dead_letter(self, delivery: Delivery, reason: str, fingerprint: str = "") -> str:
        task = delivery.task
        if task is not None:
            payload = delivery.fields.get("t", "")
            keys = [delivery.stream, self.keys.dead, self.keys.seen(task.site_id)]
        else:
            payload = json.dumps(dict(delivery.fields), ensure_ascii=False)[:65536]
            keys = [delivery.stream, self.keys.dead]
            fingerprint = ""
        args = [self.keys.group, delivery.msg_id, payload, reason[:2000], self.consumer,
                delivery.deliveries, f"{time.time():.3f}", fingerprint]
        return str(await self._dead(keys=keys, args=args))

    async def leave(self) -> int:
        """Remove this consumer from the group of every stream where it holds nothing pending
        (a graceful stop after its hand-back): otherwise every worker process ever started
        stays listed. A stream where it still holds entries keeps it, or they could never be
        reclaimed. Returns how many streams it left."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xpending_range(stream, self.keys.group, "-", "+", 1,
                                    consumername=self.consumer)
            held = await pipe.execute(raise_on_error=False)
        empty = [s for s, reply in zip(self.streams, held, strict=True)
                 if isinstance(reply, list) and not reply]
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
        return sorted({name for _, name in gone})

    async def namespace_quiet(self) -> bool:
        """True when no task waits in any stream, is pending on any consumer (entries are
        XDEL'd on ack) or is deferred in the delayed set."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xlen(stream)
            pipe.zcard(self.keys.delayed)
            counts = await pipe.execute()
        return not any(int(n) for n in counts)

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

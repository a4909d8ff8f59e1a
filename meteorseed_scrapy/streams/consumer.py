"""The worker's side of the task stream: read, reclaim, keep alive, ack, dead-letter, hand back.

Every method is one round trip (a command or one Lua script) on a ``redis.asyncio`` client
created with ``decode_responses=True``. Nothing here knows about Scrapy.
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
from meteorseed_scrapy.keys import KeyLayout
from meteorseed_scrapy.tasks import ExecTask, TaskError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    """One stream entry as delivered to this consumer; ``task`` is None when it is malformed."""

    msg_id: str
    fields: Mapping[str, str]
    deliveries: int
    task: ExecTask | None = None
    error: str = ""

    @classmethod
    def decode(cls, msg_id: str, fields: Mapping[str, str] | None, deliveries: int) -> Delivery:
        fields = fields or {}
        try:
            return cls(msg_id, fields, deliveries, ExecTask.from_message(fields))
        except TaskError as exc:
            return cls(msg_id, fields, deliveries, None, f"malformed message: {exc}")


class StreamConsumer:
    def __init__(self, redis: Any, keys: KeyLayout, consumer: str) -> None:
        self.redis = redis
        self.keys = keys
        self.consumer = consumer
        self._dead = scripts.register(redis, "dead")
        self._touch = scripts.register(redis, "touch")
        self._handback = scripts.register(redis, "handback")
        self._reclaim = scripts.register(redis, "reclaim")
        self._reclaim_cursor = "0-0"

    async def ensure_group(self) -> None:
        """Create the consumer group (from the stream's start) unless it exists."""
        try:
            await self.redis.xgroup_create(self.keys.stream, self.keys.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(self, count: int, block_ms: int) -> list[Delivery]:
        reply = await self.redis.xreadgroup(
            self.keys.group, self.consumer, {self.keys.stream: ">"}, count=count, block=block_ms
        )
        out: list[Delivery] = []
        for _stream, entries in reply or []:
            for msg_id, fields in entries:
                out.append(Delivery.decode(msg_id, fields, 1))
        return out

    async def reclaim(self, min_idle_s: float, count: int) -> list[Delivery]:
        """Entries idle for ``min_idle_s`` on any consumer (dead workers, failed tasks)."""
        cursor, entries = await self._reclaim(
            keys=[self.keys.stream],
            args=[self.keys.group, self.consumer, int(min_idle_s * 1000), self._reclaim_cursor,
                  count],
        )
        self._reclaim_cursor = cursor
        out = []
        for msg_id, flat, deliveries in entries:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            out.append(Delivery.decode(msg_id, fields, int(deliveries)))
        return out

    async def touch(self, msg_ids: Sequence[str]) -> list[str]:
        """Reset the idle time of our pending entries; returns the ids that are no longer ours."""
        if not msg_ids:
            return []
        lost = await self._touch(
            keys=[self.keys.stream], args=[self.keys.group, self.consumer, *msg_ids]
        )
        return list(lost)

    async def hand_back(self, deliveries: Sequence[Delivery], idle_s: float) -> int:
        if not deliveries:
            return 0
        args: list[Any] = [self.keys.group, self.consumer, int(idle_s * 1000)]
        for d in deliveries:
            args += [d.msg_id, max(0, d.deliveries - 1)]
        return int(await self._handback(keys=[self.keys.stream], args=args))

    async def record_completions(self, records: Sequence[tuple[str, str]], ttl: int) -> None:
        """Write ``(task_id, record JSON)`` completion records, before the tasks are acked.

        A task redelivered after a crash between this write and its ack is then acked
        without a refetch (and so is a duplicate message of a task that is already done).
        """
        await self.complete(records, (), ttl)

    async def ack(self, msg_ids: Sequence[str]) -> int:
        """XACK then XDEL (so XLEN = waiting + pending); returns how many were still pending."""
        return await self.complete((), msg_ids, 0)

    async def complete(self, records: Sequence[tuple[str, str]], msg_ids: Sequence[str],
                       ttl: int) -> int:
        """Completion records first, then XACK and XDEL of ``msg_ids``: one round trip.

        Commands of a pipeline run in order, so no entry is acked before the records sent
        with it are written, and no entry is deleted before it is acked.
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            for task_id, record in records:
                pipe.set(self.keys.done(task_id), record, ex=ttl)
            if msg_ids:
                pipe.xack(self.keys.stream, self.keys.group, *msg_ids)
                pipe.xdel(self.keys.stream, *msg_ids)
            if not len(pipe):
                return 0
            replies = await pipe.execute()
        return int(replies[len(records)]) if msg_ids else 0

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
            keys = [self.keys.stream, self.keys.dead, self.keys.seen(task.site_id)]
        else:
            payload = json.dumps(dict(delivery.fields), ensure_ascii=False)[:65536]
            keys = [self.keys.stream, self.keys.dead]
            fingerprint = ""
        args = [self.keys.group, delivery.msg_id, payload, reason[:2000], self.consumer,
                delivery.deliveries, f"{time.time():.3f}", fingerprint]
        return str(await self._dead(keys=keys, args=args))

    async def namespace_quiet(self) -> bool:
        """True when no task waits, is pending on any consumer (entries are XDEL'd on ack) or
        is deferred in the delayed set."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(self.keys.stream)
            pipe.zcard(self.keys.delayed)
            waiting, delayed = await pipe.execute()
        return int(waiting) == 0 and int(delayed) == 0

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

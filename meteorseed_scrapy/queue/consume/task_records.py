"""The per-task records kept beside the task streams: completion records and failure notes.

A completion record (``<ns>:done:<task id>``, written with the ack by
:meth:`~meteorseed_scrapy.queue.consume.consumer.StreamConsumer.complete`) lets a task redelivered
after a crash be acked without a refetch; a failure note (``<ns>:failed:<task id>``) lets the
dead letter of a task that keeps failing say why. Both are in their task's shard (its site's
slot), with its stream. Every method is one round trip on a ``redis.asyncio`` client created
with ``decode_responses=True``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from meteorseed_scrapy.queue.keys import KeyLayout, ShardKeys, shard_of
from meteorseed_scrapy.queue.shards import is_cluster
from meteorseed_scrapy.task.exec_task import ExecTask

__all__ = ["TaskRecords"]


class TaskRecords:
    """Reads the completion records and writes and reads the failure notes of tasks."""

    def __init__(self, redis: Any, keys: KeyLayout) -> None:
        self.redis = redis
        self.keys = keys
        self._cluster = is_cluster(redis)

    async def _mget(self, tasks: Sequence[ExecTask], key: Callable[[ShardKeys, str], str]
                    ) -> list[str | None]:
        """``key(shard, task_id)`` of every task: one MGET per shard (one slot each)."""
        groups: dict[int, list[int]] = {}
        for i, task in enumerate(tasks):
            groups.setdefault(shard_of(task.site_id, self.keys.shards), []).append(i)
        out: list[str | None] = [None] * len(tasks)
        shards = self.keys.shard_keys
        names = [[key(shards[k], tasks[i].task_id) for i in positions]
                 for k, positions in groups.items()]
        if self._cluster:  # a cluster pipeline refuses MGET: concurrent calls, one per slot
            replies = await asyncio.gather(*(self.redis.mget(group) for group in names))
        else:
            async with self.redis.pipeline(transaction=False) as pipe:
                for group in names:
                    pipe.mget(group)
                replies = await pipe.execute()
        for positions, values in zip(groups.values(), replies, strict=True):
            for i, value in zip(positions, values, strict=True):
                out[i] = value
        return out

    async def completion_records(self, tasks: Sequence[ExecTask]) -> list[str | None]:
        if not tasks:
            return []
        return await self._mget(tasks, lambda shard, t: shard.done(t))

    async def note_failures(self, failures: Sequence[tuple[ExecTask, str]], ttl: int) -> None:
        """Remember why tasks failed, so the dead letter of a task that keeps failing says why."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task, reason in failures:
                pipe.set(self.keys.for_site(task.site_id).failed(task.task_id), reason[:2000],
                         ex=ttl)
            await pipe.execute()

    async def failure_notes(self, tasks: Sequence[ExecTask]) -> dict[str, str]:
        if not tasks:
            return {}
        notes = await self._mget(tasks, lambda shard, t: shard.failed(t))
        return {t.task_id: n for t, n in zip(tasks, notes, strict=True) if n}

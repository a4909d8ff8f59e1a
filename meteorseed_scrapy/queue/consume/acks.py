"""The settling side of the task streams: acks with their completion records and items feed
entries (``ack.lua``), and dead letters (``dead.lua``), used through
:class:`~meteorseed_scrapy.queue.consume.consumer.StreamConsumer`; and the per-task records
read back (:class:`TaskRecords`).

A completion record (``<ns>:done:<task id>``, written with the ack) lets a task redelivered
after a crash be acked without a refetch; a failure note (``<ns>:failed:<task id>``) lets the
dead letter of a task that keeps failing say why. Both are in their task's shard (its site's
slot), with its stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from meteorseed_scrapy.queue.consume.deadletters import letter_id
from meteorseed_scrapy.queue.consume.delivery import Delivery, Ref
from meteorseed_scrapy.queue.fleet.crawl_progress import (
    Settle,
    ack_args,
    events_key,
    finish_if_done,
    settle_acks,
)
from meteorseed_scrapy.queue.keys import KeyLayout, ShardKeys, shard_of
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.queue.plumbing.scripts import ScriptPipeline
from meteorseed_scrapy.queue.shards import call_scripts, is_cluster
from meteorseed_scrapy.settings import FeedConfig
from meteorseed_scrapy.task.exec_task import ExecTask

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

__all__ = ["Completion", "Settler", "TaskRecords"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    """A finished task's completion record and its items feed entries: written by the script
    that acks the task's (first) delivery, ahead of the ack."""

    task: ExecTask
    record: str
    feed: Sequence[Mapping[str, str]] = ()


class _Call:
    """One ``ack.lua`` call: one task stream's acks, with the records and feed entries of its
    tasks."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.records: list[str] = []  # key, record, ...
        self.feed: list[Any] = []  # per entry: n, then n field/value pairs
        self.entries = 0
        self.acks: list[Any] = []

    def args(self, head: Sequence[Any]) -> list[Any]:
        return [*head, len(self.records) // 2, *self.records, self.entries, *self.feed,
                *self.acks]


class Settler:
    """Acks and dead letters of one consumer of the group."""

    def __init__(self, redis: AsyncRedis, keys: KeyLayout, consumer: str, progress_retention: int
                 ) -> None:
        self.redis = redis
        self.keys = keys
        self.consumer = consumer
        self.progress_retention = progress_retention
        self._events = events_key(keys)
        self._cluster = is_cluster(redis)
        self._ack = scripts.register(redis, "ack")
        self._dead = scripts.register(redis, "dead")
        self._release = scripts.register(redis, "dedup_release")

    def _calls(self, refs: Sequence[Ref], settles: Sequence[Settle | None],
               done: Sequence[Completion | None]) -> tuple[list[_Call], list[Completion]]:
        """``ack.lua``'s calls (one per stream), and the completions whose record cannot go in
        their stream's call (a cluster, a task in another shard's stream than its site's)."""
        calls: dict[str, _Call] = {}
        apart: list[Completion] = []
        for i, (stream, msg_id) in enumerate(refs):
            call = calls.get(stream)
            if call is None:
                call = calls[stream] = _Call(stream)
            call.acks += ack_args(msg_id, settles[i] if i < len(settles) else None)
            completion = done[i] if i < len(done) else None
            if completion is None:
                continue
            shard = self.keys.for_site(completion.task.site_id)
            if self._cluster and shard != self.keys.shard_of_stream(stream):
                apart.append(completion)
            else:
                call.records += [shard.done(completion.task.task_id), completion.record]
            for entry in completion.feed:
                call.feed += [len(entry), *(v for pair in entry.items() for v in pair)]
                call.entries += 1
        return list(calls.values()), apart

    async def complete(self, refs: Sequence[Ref], ttl: int,
                       settles: Sequence[Settle | None] = (),
                       done: Sequence[Completion | None] = (),
                       feed: FeedConfig | None = None) -> int:
        """See :meth:`StreamConsumer.complete`."""
        calls, apart = self._calls(refs, settles, done)
        if not calls:
            return 0
        feed = feed or FeedConfig()
        head = [self.keys.group, self.consumer, self._events, f"{time.time():.3f}",
                self.progress_retention, ttl, feed.maxlen, int(feed.max_age * 1000)]
        scripted = [(self._keys(call), call.args(head)) for call in calls]
        if self._cluster:  # its pipelines refuse scripts
            replies = await call_scripts(self.redis, self._ack, scripted)
        else:
            async with self.redis.pipeline(transaction=False) as pipe:
                batch = ScriptPipeline(pipe)
                for keys, args in scripted:
                    batch.call(self._ack, keys, args)
                replies = await batch.execute()
        if apart:
            # After the scripts, as ack.lua writes a record after its task's feed entries: a
            # refused script must not leave a record that acks a redelivery without a refetch
            # (a crash after the ack and before the record costs nothing: no redelivery).
            async with self.redis.pipeline(transaction=False) as pipe:
                for c in apart:
                    pipe.set(self.keys.for_site(c.task.site_id).done(c.task.task_id), c.record,
                             ex=ttl)
                await pipe.execute()
        return await settle_acks(self.redis, self.keys, replies, self.progress_retention)

    def _keys(self, call: _Call) -> list[str]:
        if not call.entries:
            return [call.stream]
        return [call.stream, self.keys.shard_of_stream(call.stream).items_feed]

    async def dead_letter(self, delivery: Delivery, reason: str, fingerprint: str = "") -> str:
        """See :meth:`StreamConsumer.dead_letter`."""
        task = delivery.task
        shard = self.keys.shard_of_stream(delivery.stream)
        keys = [delivery.stream, shard.dead]
        release = ""
        if task is None:
            fingerprint = ""
        elif self.keys.for_site(task.site_id) == shard:
            keys.append(shard.seen(task.site_id))
        else:
            release, fingerprint = fingerprint, ""
        # A reason may quote a value that is not UTF-8: escaped, so that Redis can take it.
        reason = reason[:2000].encode("utf-8", "backslashreplace").decode("utf-8")
        args: list[str | int] = [
            self.keys.group, delivery.msg_id, delivery.dead_payload, reason, self.consumer,
            delivery.deliveries, f"{time.time():.3f}", fingerprint,
            task.seed_id if task else "", task.site_id if task else "", self._events,
            self.progress_retention]
        dead_id = await self._dead(keys=keys, args=args)
        if not dead_id:
            # Normal after a reclaim: the caller logs it once, with the task (INFO).
            logger.debug("Task message %s of %s was taken over by another worker: not "
                         "dead-lettered here (%s)", delivery.msg_id, delivery.stream, reason)
            return ""
        if release and task is not None:
            await self._release(keys=[self.keys.seen(task.site_id)],
                                args=["", bytes.fromhex(release)])
        if task is not None and self.keys.tagged:
            await finish_if_done(self.redis, self.keys, [task.seed_id], self.progress_retention)
        return letter_id(self.keys, shard.index, text_of(dead_id))


class TaskRecords:
    """Reads the completion records and writes and reads the failure notes of tasks. Every
    method is one round trip on a ``redis.asyncio`` client created with
    ``decode_responses=True``."""

    def __init__(self, redis: AsyncRedis, keys: KeyLayout) -> None:
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
                out[i] = cast("str | None", value)  # (a decode_responses client)
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

"""Read plans: one piece of code that reads Redis for a synchronous and an asyncio client alike.

A plan is a generator that yields a list of :class:`Batch` es (pipelines) and is sent back the
replies of each, in order, until it returns its result; :func:`run_sync` runs it on redis-py's
client (the CLI), :func:`run_async` on ``redis.asyncio`` (the API, the metrics, the worker).
Either may be a cluster client: a batch is a non-transactional pipeline (split per node), a
MULTI (its keys must share one slot) or direct calls (TIME: a cluster pipeline refuses it).
A command that fails with a Redis error gives the exception as its reply, for the plan to judge;
a lost connection raises. A Redis above its ``maxmemory`` refuses every command queued in a
MULTI, reads too (``OOM command not allowed``): such a batch is read again as a plain pipeline,
its counts then from a few instants, since a full Redis is when they matter most.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.plumbing.connection import out_of_memory

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis, SyncRedis

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    name: str  # a redis-py command method: "xlen", "zrange", ...
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def call(name: str, *args: Any, **kwargs: Any) -> Call:
    return Call(name, args, kwargs)


@dataclass(frozen=True)
class Batch:
    calls: list[Call]
    transaction: bool = False  # one MULTI/EXEC: the counts in it agree at one instant
    direct: bool = False  # each call on the client itself, not pipelined


Plan = Generator[list[Batch], list[list[Any]], T]


def run_sync(client: SyncRedis, plan: Plan[T]) -> T:
    try:
        batches = next(plan)
        while True:
            batches = plan.send([_batch_sync(client, batch) for batch in batches])
    except StopIteration as done:
        return done.value


async def run_async(client: AsyncRedis, plan: Plan[T]) -> T:
    try:
        batches = next(plan)
        while True:
            batches = plan.send([await _batch_async(client, batch) for batch in batches])
    except StopIteration as done:
        return done.value


def _batch_sync(client: SyncRedis, batch: Batch) -> list[Any]:
    if not batch.calls:
        return []
    if batch.direct:
        out: list[Any] = []
        for c in batch.calls:
            try:
                out.append(getattr(client, c.name)(*c.args, **c.kwargs))
            except ResponseError as exc:
                out.append(exc)
        return out
    try:
        return _pipelined_sync(client, batch.calls, batch.transaction)
    except ResponseError as exc:
        if not (batch.transaction and out_of_memory(exc)):
            raise
        return _pipelined_sync(client, batch.calls, False)


def _pipelined_sync(client: SyncRedis, calls: list[Call], transaction: bool) -> list[Any]:
    with client.pipeline(transaction=transaction) as pipe:
        for c in calls:
            getattr(pipe, c.name)(*c.args, **c.kwargs)
        return list(pipe.execute(raise_on_error=False))


async def _batch_async(client: AsyncRedis, batch: Batch) -> list[Any]:
    if not batch.calls:
        return []
    if batch.direct:
        out: list[Any] = []
        for c in batch.calls:
            try:
                out.append(await getattr(client, c.name)(*c.args, **c.kwargs))
            except ResponseError as exc:
                out.append(exc)
        return out
    try:
        return await _pipelined_async(client, batch.calls, batch.transaction)
    except ResponseError as exc:
        if not (batch.transaction and out_of_memory(exc)):
            raise
        return await _pipelined_async(client, batch.calls, False)


async def _pipelined_async(client: AsyncRedis, calls: list[Call], transaction: bool
                           ) -> list[Any]:
    async with client.pipeline(transaction=transaction) as pipe:
        for c in calls:  # (an asyncio pipeline queues a command without awaiting)
            getattr(pipe, c.name)(*c.args, **c.kwargs)
        return list(await pipe.execute(raise_on_error=False))


__all__ = ["Batch", "Call", "Plan", "call", "run_async", "run_sync"]

"""Ordered pipelining of a caller's batches (``seed-expand``'s): each batch's script calls are
written behind those of the batch before on one connection, with fallbacks for a cluster, a
single-connection client and a failed connection (see :class:`ScriptOrder`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN
from meteorseed_scrapy.queue.shards import call_scripts, is_cluster

if TYPE_CHECKING:
    import redis.asyncio
    from redis.asyncio.connection import AbstractConnection
    from redis.commands.core import AsyncScript

    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

__all__ = ["NotSent", "ScriptOrder", "call_in_order", "send_in_order"]

_T = TypeVar("_T")


class ScriptOrder:
    """One :meth:`~meteorseed_scrapy.queue.enqueue.writer.TaskWriter.enqueue` call in a caller's
    sequence of them (the expansion engine's batches), given the call before it as ``after``.

    Its scripts are written to Redis right behind those of the call before, on the same
    connection, without waiting for their replies: Redis runs them back to back and in order
    (it does not idle for a round trip and the packing of the next batch between two
    batches), and the replies are read in order. A call is not sent when the one before it
    could not be sent. (On a cluster, or a single-connection client, a call waits for the one
    before it to be done instead.)
    """

    def __init__(self, after: ScriptOrder | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.after = after
        self.sent: asyncio.Future[None] = loop.create_future()  # its scripts written
        self.done: asyncio.Future[None] = loop.create_future()  # their replies read
        self.lane: _Lane = after.lane if after is not None else _Lane()

    def finish(self, sent: bool) -> None:
        """Mark this call done (``sent``: whether its scripts were written)."""
        for future, ok in ((self.sent, sent), (self.done, True)):
            if not future.done():
                if ok:
                    future.set_result(None)
                else:
                    future.set_exception(NotSent("not sent"))
                    future.exception()  # (retrieved: the caller sees its own error)
        self.after = None  # (done: so a long run does not keep a chain of every call)

    async def wait_sent(self) -> None:
        """Until the call before has written its scripts; :class:`NotSent` if it did not."""
        if self.after is not None:
            await asyncio.wait([self.after.sent])
            if self.after.sent.exception() is not None:
                raise NotSent("the enqueue call before this one was not sent")

    async def wait_done(self) -> None:
        if self.after is not None:
            await asyncio.wait([self.after.done])


@dataclass
class _Lane:
    """The connection of a sequence of :class:`ScriptOrder` calls while any is unanswered."""

    conn: AbstractConnection | None = None
    users: int = 0
    broken: bool = False  # a connection failed: one call at a time from then on


class NotSent(Exception):
    """An :meth:`~meteorseed_scrapy.queue.enqueue.writer.TaskWriter.enqueue` call with an order
    whose call before was not sent (it failed first): nothing of it was
    sent either."""


async def send_in_order(after: ScriptOrder | None,
                        call: Callable[[ScriptOrder], Awaitable[_T]]
                        ) -> tuple[ScriptOrder, asyncio.Task[_T]]:
    """Start ``call(order)`` (an enqueue with ``order``) behind the call of ``after`` and return
    once its scripts are written, or it is done: ``order`` for the next call, and the task to
    await its reply with. ``order`` is finished when the task ends, cancelled before it ran
    included (else the next call would wait for ever)."""
    order = ScriptOrder(after)
    task = asyncio.ensure_future(call(order))

    def finish(task: asyncio.Future[_T]) -> None:
        order.finish(sent=not task.cancelled() and task.exception() is None)

    task.add_done_callback(finish)
    either: list[asyncio.Future[Any]] = [order.sent, task]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    return order, task


async def call_in_order(redis: AsyncRedis, order: ScriptOrder, script: AsyncScript,
                        calls: list[tuple[list[str], list[str | bytes]]]) -> list[Any]:
    """The replies of ``calls`` of ``script``, made behind those of ``order.after`` (see
    :class:`ScriptOrder`); ``order`` is finished when this returns or raises."""
    if is_cluster(redis) or redis.single_connection_client:
        await order.wait_sent()
        await order.wait_done()
        try:
            return list(await call_scripts(redis, script, calls))
        finally:
            order.finish(sent=True)
    return await _pipelined(redis, order, script, calls)


async def _pipelined(redis: redis.asyncio.Redis, order: ScriptOrder, script: AsyncScript,
                     calls: list[tuple[list[str], list[str | bytes]]]) -> list[Any]:
    """``calls`` of ``script`` written right behind those of ``order.after`` on its
    connection, the replies read after its (see :class:`ScriptOrder`)."""
    lane, pool, sent = order.lane, redis.connection_pool, False
    try:
        await order.wait_sent()
        if lane.broken:  # (one at a time from here on, as without an order)
            await order.wait_done()
            sent = True
            return list(await call_scripts(redis, script, calls))
        if lane.conn is None:
            lane.conn = await pool.get_connection()
        conn = lane.conn
        lane.users += 1
        try:
            for keys, args in calls:
                # EVAL, not EVALSHA: a script cache flushed mid-run cannot answer NOSCRIPT
                # to one call while the call queued behind it, run after a reload, gets
                # in first. (Redis hashes the 16 KB source: ~1 % of a call.) No health
                # check: its PING reply would be read in place of a script's.
                await conn.send_packed_command(
                    conn.pack_command("EVAL", script.script, len(keys), *keys, *args),
                    check_health=False)
            sent = True
            order.sent.set_result(None)
            await order.wait_done()
            replies: list[Any] = []
            for _ in calls:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as exc:  # (read: the connection stays in step)
                    replies.append(exc)
        except REDIS_DOWN:
            # As redis-py retries a call whose connection failed (enqueue.lua's dedup
            # makes a second run of a batch harmless), but one call at a time, in order.
            lane.broken = True
            await _drop(lane, conn)
            if not sent:
                sent = True
                order.sent.set_result(None)
            await order.wait_done()
            return list(await call_scripts(redis, script, calls))
        except BaseException:
            await _drop(lane, conn)  # (replies left unread: no one else may use it)
            raise
        finally:
            lane.users -= 1
            if lane.users == 0 and lane.conn is not None:
                held, lane.conn = lane.conn, None
                await pool.release(held)
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies
    finally:
        order.finish(sent)


async def _drop(lane: _Lane, conn: AbstractConnection) -> None:
    if lane.conn is conn:
        lane.conn = None
    await conn.disconnect()

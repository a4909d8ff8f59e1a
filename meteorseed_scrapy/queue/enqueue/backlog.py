"""How many tasks wait in the task streams, and waiting until few enough do (backpressure).

Workers XDEL an entry right after XACKing it, so a stream's XLEN counts its waiting plus its
pending entries, and XPENDING's summary gives the pending ones (this works on Redis 6.2, whose
XINFO GROUPS has no ``lag``). A stream is never trimmed to make room: writers wait instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.fleet.spiders import with_registered
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.reads import Batch, Plan, call, run_async

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

logger = logging.getLogger(__name__)

#: Seconds between two ``on_wait`` reports while :func:`wait_for_room` waits.
WAIT_REPORT_INTERVAL = 10.0


@dataclass(frozen=True)
class StreamCount:
    """Tasks of one stream (or a sum of streams): waiting to be delivered, and pending."""

    waiting: int = 0
    pending: int = 0

    def __add__(self, other: StreamCount) -> StreamCount:
        return StreamCount(self.waiting + other.waiting, self.pending + other.pending)

    @classmethod
    def of(cls, length: Any, pending: Any) -> StreamCount:
        """From the replies of XLEN and XPENDING (summary form) of one stream."""
        if isinstance(length, Exception):
            raise length
        if isinstance(pending, ResponseError) and str(pending).startswith("NOGROUP"):
            # No consumer group yet (no worker ever started): every entry is waiting.
            pending_count = 0
        elif isinstance(pending, Exception):
            raise pending
        elif isinstance(pending, (list, tuple)):  # raw reply: a cluster MULTI skips parsing
            pending_count = int(pending[0])
        else:
            pending_count = int(pending["pending"])
        return cls(max(0, int(length) - pending_count), pending_count)


def shard_counts_plan(streams: Sequence[str], group: str) -> Plan[dict[str, StreamCount]]:
    """XLEN and XPENDING of ``streams`` (of one shard: one slot) in one MULTI."""
    calls = [c for stream in streams
             for c in (call("xlen", stream), call("xpending", stream, group))]
    (replies,) = yield [Batch(calls, transaction=True)]
    return {stream: StreamCount.of(length, pending)
            for stream, length, pending in zip(streams, replies[::2], replies[1::2], strict=True)}


async def stream_counts(redis: AsyncRedis, keys: KeyLayout) -> dict[str, StreamCount]:
    """Waiting and pending tasks per task stream of every shard, read in one MULTI per shard so
    the counts of a stream agree."""
    out: dict[str, StreamCount] = {}
    keys = await with_registered(redis, keys)  # (every spider's task set counts too)
    for shard in keys.shard_keys:
        out.update(await run_async(redis, shard_counts_plan(shard.streams, keys.group)))
    return out


async def wait_for_room(backlog: Callable[[], Awaitable[int]], max_backlog: int,
                        on_wait: Callable[[int], None] | None, poll: float = 1.0) -> int:
    """Return ``await backlog()`` once it is at most ``max_backlog``; until then sleep ``poll``
    seconds between checks and log, and call ``on_wait(backlog)`` if given, every
    :data:`WAIT_REPORT_INTERVAL` seconds."""
    if max_backlog < 0:
        raise ValueError(f"max_backlog must be >= 0, got {max_backlog}")
    last_report: float | None = None
    while True:
        waiting = await backlog()
        if waiting <= max_backlog:
            return waiting
        now = time.monotonic()
        if last_report is None or now - last_report >= WAIT_REPORT_INTERVAL:
            last_report = now
            logger.info("backlog %d > %d: waiting for workers", waiting, max_backlog)
            if on_wait is not None:
                on_wait(waiting)
        await asyncio.sleep(poll)

"""Shortcuts tests use on the queue's classes, kept out of the product: a worker only ever
completes tasks through :meth:`StreamConsumer.complete` and never asks the gate for a pause."""

from __future__ import annotations

from collections.abc import Sequence

from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delivery import Ref
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.shards import call_scripts
from meteorseed_scrapy.task.exec_task import ExecTask


async def ack(consumer: StreamConsumer, refs: Sequence[Ref]) -> int:
    """XACK then XDEL (so XLEN = waiting + pending) of those of ``refs`` still pending on
    ``consumer``, no completion record; returns how many."""
    return await consumer.complete(refs, 0)


async def touch(consumer: StreamConsumer, refs: Sequence[Ref]) -> list[Ref]:
    """What the keep-alive thread does, on ``consumer``'s own client: reset the idle time of
    its pending entries among ``refs``; returns those that are no longer its own."""
    calls = consumer.touch_calls(refs)
    if not calls:
        return []
    script = scripts.register(consumer.redis, "touch")
    return consumer.touch_lost(calls, await call_scripts(consumer.redis, script, calls))


async def paused_for(gate: SiteGate, site: str) -> float:
    """Seconds left on the pause of ``site``'s quota (0.0: not paused)."""
    pause = gate.keys.site(gate.limits_for(site).quota(site), "pause")
    return max(0.0, int(await gate.redis.pttl(pause)) / 1000)


async def is_seen(writer: TaskWriter, task: ExecTask, now: int | None = None) -> bool:
    """True when ``task``'s site has recorded its URL (as ``writer`` fingerprints it) and the
    re-crawl window is not over at ``now`` (epoch s; None: the Redis server's time)."""
    [seen] = await scripts.register(writer.redis, "dedup_seen")(
        keys=[writer.keys.seen(task.site_id)],
        args=["" if now is None else str(now), writer.fingerprint(task)],
    )
    return bool(int(seen))

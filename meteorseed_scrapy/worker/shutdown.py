"""A worker's last writes when it stops: what settled tasks left queued is written within a
deadline (Redis may be away, or full: retried until then), the tasks still held are handed back
to the stream for another worker, and the worker leaves the consumer group."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delivery import Delivery
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN, out_of_memory
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.loops import Outage

logger = logging.getLogger(__name__)


async def last_writes(completions: Completions, consumer: StreamConsumer, config: WorkerConfig,
                      outage: Outage, full: RedisFull, *, unsettled: Callable[[], list[Delivery]],
                      flush_permits: Callable[[], Awaitable[None]] | None,
                      deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            await completions.flush_once()
            await completions.drain()
            if flush_permits is not None:
                await flush_permits()
            n = await consumer.hand_back(unsettled(), idle_s=config.claim_idle + 3600)
            if n:
                logger.info("Handed %d unfinished task(s) back to the stream", n)
                completions.stats.inc_value("meteorseed/handed_back", n)
            if not completions.pending():
                break
        except REDIS_DOWN as exc:
            await asyncio.sleep(min(outage.failed(exc, "shutdown"), 1.0))
        except ResponseError as exc:
            if not out_of_memory(exc):
                raise
            await asyncio.sleep(full.failed(exc, "shutdown"))
    else:
        logger.error("Stopped with %d ack(s), %d child request(s), %d dead letter(s), %d"
                     " deferral(s), %d failure note(s) and %d task history record(s) not"
                     " written: the tasks among them stay pending and will be redelivered",
                     len(completions.acks), len(completions.outbox), len(completions.dead),
                     len(completions.deferrals), len(completions.failures),
                     len(completions.history.ends))
    try:
        await consumer.membership().leave()
    except Exception as exc:  # (Redis away: the consumer stays listed)
        logger.debug("Could not leave the consumer group: %s", exc)


__all__ = ["last_writes"]

"""A worker's side of an operator's hold or cancel of a seed
(:mod:`~meteorseed_scrapy.queue.consume.seed_control`).

Every :data:`~meteorseed_scrapy.queue.consume.seed_control.POLL_S` the held and cancelled seeds
are read (one round trip). A task of a held seed is not started: it is parked in the delayed
set (reason ``paused``) as a held site's are, and comes back on resume. A task of a cancelled
seed is settled as cancelled without a fetch: acked and deleted while still pending here,
counted in its seed's progress, recorded in the task history. Both are checked when a task is
about to start and, for the tasks waiting in this worker, at each read of the sets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import STALE_PARK_S, STALE_VIEW_S
from meteorseed_scrapy.queue.consume.seed_control import PARK_S, POLL_S
from meteorseed_scrapy.queue.fleet.crawl_progress import events_key, finish_if_done
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.fate import Outcome
from meteorseed_scrapy.worker.ledger import Entry, TaskLedger
from meteorseed_scrapy.worker.waiting import WaitingTasks

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)


class SeedHolds:
    def __init__(self, consumer: StreamConsumer, ledger: TaskLedger, buffer: WaitingTasks,
                 completions: Completions, stats: StatsCollector, *,
                 on_gone: Callable[[str], None]) -> None:
        self._consumer = consumer
        self._ledger = ledger
        self._buffer = buffer
        self._completions = completions
        self._stats = stats
        self._on_gone = on_gone  # (task_id) left this worker without starting
        self._script = scripts.register(consumer.redis, "seed_cancel")
        self.held: frozenset[str] = frozenset()
        self.cancelled: frozenset[str] = frozenset()
        self.read_at = 0.0  # (monotonic) when ``held`` and ``cancelled`` were asked for
        self._cancelling: list[Entry] = []

    def stops(self, entry: Entry) -> bool:
        """``entry``'s task may not start now: parked (a held seed) or being settled as
        cancelled. False: it may go."""
        seed = entry.task.seed_id
        if seed in self.cancelled:
            self._ledger.pop(entry.task.task_id)
            self._cancelling.append(entry)
            self._on_gone(entry.task.task_id)
            return True
        if seed in self.held:
            self._ledger.pop(entry.task.task_id)
            stale = time.monotonic() - self.read_at > STALE_VIEW_S
            self._completions.parked(entry, STALE_PARK_S if stale else PARK_S,
                                     DeferReason.PAUSED)
            self._stats.inc_value("meteorseed/seed_held/parked")
            self._on_gone(entry.task.task_id)
            return True
        return False

    async def step(self) -> None:
        await self.refresh()
        if self.held or self.cancelled:
            self._sweep()
        if self._cancelling:
            await self._settle_cancelled()
        await asyncio.sleep(POLL_S)

    async def refresh(self) -> None:
        redis, keys = self._consumer.redis, self._consumer.keys
        # The view is as old as the asking: a reply that waited on a blocked loop is stale.
        asked = time.monotonic()
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hkeys(keys.seeds_held)
            pipe.zrangebyscore(keys.seeds_cancelled, f"({int(time.time() * 1000)}", "+inf")
            held, cancelled = await pipe.execute()
        self.held = frozenset(text_of(s) for s in held)
        self.cancelled = frozenset(text_of(s) for s in cancelled)
        self.read_at = asked

    def _sweep(self) -> None:
        """The tasks waiting here of a held or cancelled seed leave now."""
        stopped = self.held | self.cancelled
        sites = {e.task.site_id for e in self._buffer if e.task.seed_id in stopped}
        for site in sites & set(self._buffer.sites()):
            entries = self._buffer.take_all(site)
            for entry in entries:
                # (one taken over by another worker meanwhile is dropped, as a start would)
                if self._ledger.get(entry.task.task_id) is not entry:
                    continue
                if entry.task.seed_id not in stopped or not self.stops(entry):
                    self._buffer.append(site, entry)

    async def _settle_cancelled(self) -> None:
        entries, self._cancelling = self._cancelling, []
        by: dict[str, list[Any]] = {}
        keys = self._consumer.keys
        head = ["pending", keys.group, self._consumer.consumer, events_key(keys),
                f"{time.time():.3f}", self._consumer.progress_retention]
        for entry in entries:
            for d in entry.deliveries:
                by.setdefault(d.ref[0], list(head)).extend(
                    [d.ref[1], entry.task.seed_id, entry.task.site_id])
        settled, zeroed = 0, set[str]()
        for stream, args in by.items():
            n, seeds = await self._script(keys=[stream], args=args)
            settled += int(n)
            zeroed.update(text_of(s) for s in seeds)
        if zeroed and keys.tagged:
            await finish_if_done(self._consumer.redis, keys, sorted(zeroed),
                                 self._consumer.progress_retention)
        self._stats.inc_value("meteorseed/seed_cancelled/settled", settled)
        self._stats.inc_value(f"meteorseed/outcome/{Outcome.CANCELLED.value}", settled)
        logger.info("Settled %d task(s) of cancelled seed(s) without fetching them", settled)
        history = self._completions.history
        ends = (history.entry(e.task, Outcome.CANCELLED.value, reason="seed cancelled")
                for e in entries)
        await history.write([end for end in ends if end is not None])


__all__ = ["SeedHolds"]

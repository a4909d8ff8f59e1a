"""Seeds that ``scrapy seed-expand FILE`` expands are registered in the seed registry, as
``POST /dispatch`` registers its seeds: the console's Seeds table and ``GET /seeds`` list them
with the run's counts (tasks enqueued, duplicates, URLs rejected) and its error.

:class:`ExpandedSeeds` is the engine's :class:`~meteorseed_scrapy.seeding.expand_types.SeedWatcher`
for such a run: it notes each seed the engine starts, registers the seeds started so far before
each batch is sent (each leased while the run lasts, so no ``--watch`` seeder expands it a second
time), adds each seed's counts to its run when it is done, and :meth:`~ExpandedSeeds.finish`
records every seed's run, which also schedules its next one when it has a schedule (a seed
without one is done). Only a counter per seed is kept; the seeds' definitions are let go once
registered.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from meteorseed_scrapy.seeding.expand_types import SeedResult, SeedWatcher
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

#: Registry calls in flight at once (each a round trip or two).
CONCURRENCY = 32
#: How long a seed of the run stays leased until its run is recorded (a run that dies leaves
#: its seeds to a seeder after this).
LEASE_S = 3600.0


@dataclass
class SeedRun:
    rev: int | None = None  # the definition revision registered (None: not registered)
    enqueued: int = 0
    duplicates: int = 0
    rejected: int = 0
    error: str | None = None


class ExpandedSeeds(SeedWatcher):
    def __init__(self, registry: SeedRegistry) -> None:
        self.registry = registry
        self.runs: dict[str, SeedRun] = {}
        self.unregistered: list[str] = []  # "seed_id: reason" of seeds the registry refused
        self.started_at = time.time()
        self._new: list[SeedTask] = []
        self._open: dict[int, SeedResult] = {}  # line number -> a seed not finished yet

    def started(self, result: SeedResult) -> None:
        self._new.append(result.seed)
        self.runs.setdefault(result.seed.seed_id, SeedRun())
        self._open[result.lineno] = result

    def finished(self, result: SeedResult) -> None:
        del self._open[result.lineno]
        run = self.runs[result.seed.seed_id]
        run.enqueued += result.enqueued
        run.duplicates += result.duplicates
        run.rejected += result.rejected
        if result.error is not None:
            run.error = result.error

    async def before_send(self) -> None:
        await self.register_new()

    async def register_new(self) -> None:
        """Register (and lease) the seeds read since the last call."""
        new, self._new = self._new, []
        for i in range(0, len(new), CONCURRENCY):
            chunk = new[i:i + CONCURRENCY]
            replies = await asyncio.gather(
                *(self.registry.put(seed, lease_s=LEASE_S) for seed in chunk),
                return_exceptions=True)
            for seed, reply in zip(chunk, replies, strict=True):
                if isinstance(reply, TaskError):
                    self.unregistered.append(f"{seed.seed_id}: {reply}")
                elif isinstance(reply, BaseException):
                    raise reply
                else:
                    self.runs[seed.seed_id].rev = reply.rev

    async def finish(self, error: str | None = None) -> int:
        """Register what is left and record every registered seed's run (``error``: the run
        stopped early, e.g. Redis failed); the number of runs recorded."""
        for result in list(self._open.values()):  # (what their batches did so far)
            self.finished(result)
        await self.register_new()
        items = [(seed_id, run) for seed_id, run in self.runs.items() if run.rev is not None]
        recorded = 0
        for i in range(0, len(items), CONCURRENCY):
            chunk = items[i:i + CONCURRENCY]
            replies = await asyncio.gather(*(self.registry.record_run(
                seed_id, started_at=self.started_at, ok=(run.error or error) is None,
                error=run.error or error, new_urls=run.enqueued, duplicates=run.duplicates,
                rejected=run.rejected, rev=run.rev) for seed_id, run in chunk))
            recorded += sum(1 for reply in replies if reply is not None)
        return recorded


__all__ = ["CONCURRENCY", "LEASE_S", "ExpandedSeeds", "SeedRun"]

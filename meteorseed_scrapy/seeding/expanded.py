"""Seeds that ``scrapy seed-expand FILE`` expands are registered in the seed registry, as
``POST /dispatch`` registers its seeds: the console's Seeds table and ``GET /seeds`` list them
with the run's counts (tasks enqueued, duplicates, URLs rejected) and its error.

:class:`ExpandedSeeds` watches one :func:`~meteorseed_scrapy.seeding.expand.expand_stream` run
from the outside: :meth:`~ExpandedSeeds.tap` reads each line's seed as it goes by, the writer
(:class:`CountingWriter`) registers the seeds read so far before each batch it sends (each
leased while the run lasts, so no ``--watch`` seeder expands it a second time) and counts the
batch's tasks per seed, and :meth:`~ExpandedSeeds.finish` records every seed's run, which also
schedules its next one when it has a schedule (a seed without one is done). Only a counter per
seed is kept; the seeds' definitions are let go once registered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from meteorseed_scrapy.queue.enqueue_calls import AddResult, Encoded
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.writer import TaskWriter
from meteorseed_scrapy.seeding.expand import Rejection
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.seed_lines import SeedLineError, parse_seed_line
from meteorseed_scrapy.task.exec_task import ExecTask
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


class ExpandedSeeds:
    def __init__(self, registry: SeedRegistry) -> None:
        self.registry = registry
        self.runs: dict[str, SeedRun] = {}
        self.unregistered: list[str] = []  # "seed_id: reason" of seeds the registry refused
        self.started_at = time.time()
        self._new: list[SeedTask] = []
        self._current: tuple[int, str] | None = None  # (line number, seed_id) being expanded

    def tap(self, lines: Iterable[str | bytes]) -> Iterator[str | bytes]:
        """``lines``, unchanged; each valid seed line's seed is noted on its way (a bad line
        is left to the expansion to report)."""
        for lineno, line in enumerate(lines, start=1):
            if line and not line.isspace():
                try:
                    seed = parse_seed_line(line, lineno)
                except SeedLineError:
                    seed = None
                if seed is not None:
                    self._new.append(seed)
                    self.runs.setdefault(seed.seed_id, SeedRun())
                    self._current = (lineno, seed.seed_id)
            yield line

    def rejected(self, rejection: Rejection) -> None:
        """Count a rejection against the seed of its line (the one being expanded)."""
        if self._current is None or rejection.lineno != self._current[0]:
            return  # a line that is no seed
        run = self.runs[self._current[1]]
        run.rejected += 1
        if rejection.url_position is None:  # the whole line failed (e.g. its sitemap)
            run.error = rejection.reason

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

    def count(self, seed_ids: Sequence[str], result: AddResult) -> None:
        for seed_id, fresh in zip(seed_ids, result.fresh, strict=False):
            run = self.runs.get(seed_id)
            if run is None:
                continue
            if fresh:
                run.enqueued += 1
            else:
                run.duplicates += 1

    async def finish(self, error: str | None = None) -> int:
        """Register what is left and record every registered seed's run (``error``: the run
        stopped early, e.g. Redis failed); the number of runs recorded."""
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


class CountingWriter(TaskWriter):
    """A :class:`TaskWriter` that registers the run's new seeds before each batch and counts
    each batch's tasks per seed: every task it encodes (either way the writer offers) is noted
    with its seed until its batch is sent."""

    def __init__(self, redis: Any, keys: KeyLayout, *, seeds: ExpandedSeeds,
                 lane: str | None = None, fingerprinter: Any = None) -> None:
        super().__init__(redis, keys, lane=lane, fingerprinter=fingerprinter)
        self.seeds = seeds
        self._seed_of: dict[int, str] = {}  # id() of an encoded task not sent yet -> seed_id

    def encode(self, task: ExecTask, dedup: bool = True, canonical: str | None = None) -> Encoded:
        item = super().encode(task, dedup, canonical)
        self._seed_of[id(item)] = task.seed_id
        return item

    def seed_encoder(self, task: ExecTask, dedup: bool = True
                     ) -> Callable[[ExecTask, str, str], Encoded]:
        inner, seed_id, seed_of = super().seed_encoder(task, dedup), task.seed_id, self._seed_of

        def encode_one(each: ExecTask, canonical: str, payload: str) -> Encoded:
            item = inner(each, canonical, payload)
            seed_of[id(item)] = seed_id
            return item

        return encode_one

    async def add_encoded(self, encoded: Sequence[Encoded]) -> AddResult:
        seed_of = self._seed_of
        seed_ids = [seed_of.pop(id(item), "") for item in encoded]
        await self.seeds.register_new()
        result = await super().add_encoded(encoded)
        self.seeds.count(seed_ids, result)
        return result


__all__ = ["CONCURRENCY", "LEASE_S", "CountingWriter", "ExpandedSeeds", "SeedRun"]

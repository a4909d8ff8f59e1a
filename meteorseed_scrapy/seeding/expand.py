"""The one seed-expansion engine: parsed seeds to exec tasks in the task streams, in batches,
with bounded memory (one URL at a time), backpressure and dedup. ``scrapy seed-expand``
(:func:`expand_lines`), ``POST /dispatch`` and the seeder (:func:`expand_seeds`) all run it.

Errors are data here, not exceptions that stop the run: a bad line is rejected with its line
number and reason, a bad URL inside a good seed with its 0-based position, and everything else
still goes to the stream. Each seed's counts fill in its :class:`SeedResult` as its batches are
answered; a :class:`SeedWatcher` learns of each seed. Reading lines is :mod:`.seed_lines`, one
seed's URLs :mod:`.seed_urls`; the options and results are :mod:`.expand_types`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from itertools import islice, pairwise
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.enqueue.batch_pipeline import ScriptOrder, send_in_order
from meteorseed_scrapy.queue.enqueue.enqueue_calls import CHUNK_SIZE
from meteorseed_scrapy.seeding.expand_types import (
    ExpandOptions,
    ExpandSummary,
    Rejection,
    SeedResult,
    SeedWatcher,
)
from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.seeding.seed_lines import parse_lines
from meteorseed_scrapy.seeding.seed_urls import UrlError, expand_checked
from meteorseed_scrapy.seeding.sitemap import SitemapError
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.enqueue.enqueue_calls import AddResult, Encoded
    from meteorseed_scrapy.queue.enqueue.writer import TaskWriter

logger = logging.getLogger(__name__)

#: URLs built between two yields to the event loop while a batch is in flight (other tasks of
#: the loop go on; a batch's scripts are written before its flush returns).
_YIELD_EVERY = 100
_NO_WATCHER = SeedWatcher()
#: A batch's seeds: (seed, first index, end index) of each run of its tasks.
_Segments = list[tuple[SeedResult, int, int]]


async def expand_lines(lines: Iterable[str | bytes], writer: TaskWriter, options: ExpandOptions,
                       *, on_error: Callable[[Rejection], None],
                       watcher: SeedWatcher | None = None,
                       summary: ExpandSummary | None = None) -> ExpandSummary:
    """:func:`expand_seeds` of JSON Lines seeds (``scrapy seed-expand``): line numbers start
    at 1, blank lines are skipped (but counted as read), a bad line is rejected alone."""
    summary = summary if summary is not None else ExpandSummary()
    return await expand_seeds(parse_lines(lines, on_error, summary), writer, options,
                              on_error=on_error, watcher=watcher, summary=summary)


async def expand_seeds(seeds: Iterable[tuple[int, SeedTask]], writer: TaskWriter,
                       options: ExpandOptions, *, on_error: Callable[[Rejection], None],
                       watcher: SeedWatcher | None = None,
                       summary: ExpandSummary | None = None) -> ExpandSummary:
    """Expand ``(line number, seed)`` pairs into exec tasks, enqueued in batches.

    Pass ``summary`` to keep the counts when Redis fails half-way (the exception propagates).
    While Redis runs one batch's script, the next batch is built, and sent behind it (in
    order, on the same connection) before its reply is in: Python's work and Redis's overlap
    instead of adding up, and Redis does not idle between two batches.
    """
    run = _Run(writer, options, on_error, watcher or _NO_WATCHER,
               summary if summary is not None else ExpandSummary())
    try:
        for lineno, seed in seeds:
            await run.seed(lineno, seed)
        await run.flush()
    finally:
        await run.settle()
    logger.debug("expansion done: %s", run.summary)
    return run.summary


class _Run:
    """One run of the engine: the batch being built and the one in flight."""

    def __init__(self, writer: TaskWriter, options: ExpandOptions,
                 on_error: Callable[[Rejection], None], watcher: SeedWatcher,
                 summary: ExpandSummary) -> None:
        self.writer, self.options, self.on_error = writer, options, on_error
        self.watcher, self.summary = watcher, summary
        self.batch: list[Encoded] = []
        self.segments: list[tuple[SeedResult, int]] = []  # (seed, first index) in the batch
        self.in_flight: tuple[asyncio.Task[AddResult], _Segments] | None = None
        self.order: ScriptOrder | None = None  # of the batch in flight
        self.encode: Callable[[ExecTask, str, str], Encoded] | None = None  # the seed's
        # Tasks that may still be sent before the backlog must be looked at again: workers
        # only ever shrink it, so after a look showing room for N, N more cannot pass it.
        self.room = 0

    def as_template(self, template: ExecTask) -> bool:
        """Whether a seed's template task may stand for each of its tasks (which share site,
        lane, priority and meta): the seed's one encoder, made here, reads none."""
        try:
            encoder = self.writer.encoder(template, self.options.dedup)
        except TaskError:  # (its tasks say why, URL by URL)
            return False
        self.encode = encoder.encode
        return not encoder.reads_tasks

    async def seed(self, lineno: int, seed: SeedTask) -> None:
        """Expand one seed into the batches."""
        result = SeedResult(seed, lineno)
        self.watcher.started(result)
        self.segments.append((result, len(self.batch)))
        options, summary, on_error, batch = self.options, self.summary, self.on_error, self.batch
        rejects, batch_size, append = options.rejects, options.batch_size, batch.append
        stop = threading.Event()  # set when this seed ends: a sitemap fetch under way stops
        self.encode = None
        position = -1
        try:
            items = expand_checked(seed, self._sitemaps(stop), self.as_template)
            encode = self.encode  # (from the template, else from the seed's first task)
            more: bool | SitemapError = True
            while more is True:
                chunk, more = await self._pull(items)
                for item in chunk:
                    position += 1
                    if isinstance(item, UrlError):
                        self._reject(result, Rejection(lineno, item.reason, item.position))
                        continue
                    task, canonical, payload, url = item
                    if rejects is not None:
                        reason = rejects(seed.site_id, url)
                        if reason is not None:
                            self._reject(result, Rejection(lineno, f"url: {reason}", position))
                            continue
                    try:
                        if encode is None:
                            encode = self.writer.encoder(task, options.dedup).encode
                        append(encode(task, canonical, payload))
                    except TaskError as exc:  # (expand checked these; a guard, not a path)
                        self._reject(result, Rejection(lineno, str(exc), position))
                        continue
                    if len(batch) >= batch_size:
                        await self.flush(result)
                    elif self.in_flight is not None and len(batch) % _YIELD_EVERY == 0:
                        await asyncio.sleep(0)
            if isinstance(more, SitemapError):
                raise more  # (after the URLs that came before it)
        except (SitemapError, TaskError) as exc:  # (its sitemap, or a payload checked now)
            summary.bad_lines += 1
            result.rejected += 1
            result.error = str(exc)
            on_error(Rejection(lineno, str(exc)))
        finally:
            stop.set()
        if self.segments[-1][1] == len(batch):  # (its last entry: none of its tasks wait here)
            self.segments.pop()
            if result.held and not self.options.dry_run:
                # Its last tasks went in a batch that held it: let it go, behind that batch
                # (answered first, while the seed is not yet expanded: finished once, below).
                await self.settle()
                await self.writer.release_expansion(seed.seed_id, seed.site_id)
                result.held = False
            result.expanded = True
            self._maybe_finished(result)  # (else once the batch holding its last tasks is)
        else:
            result.expanded = True

    def _sitemaps(self, stop: threading.Event) -> Callable[[str], FetchPolicy]:
        policy = self.options.sitemaps

        def sitemaps(site_id: str) -> FetchPolicy:
            return replace(policy(site_id) if policy is not None else FetchPolicy(), stop=stop)

        return sitemaps

    async def _pull(self, items: Iterator[Any]) -> tuple[list[Any], bool | SitemapError]:
        """The next URLs of ``items``, pulled here or on threads (``options.threads``), and
        whether there may be more (or the sitemap that failed after them)."""
        if self.watcher.stop_requested():
            raise asyncio.CancelledError
        if self.options.threads:
            size = CHUNK_SIZE
            chunk, error = await asyncio.get_running_loop().run_in_executor(
                self.options.executor, _take, items, size)
            if self.watcher.stop_requested():
                raise asyncio.CancelledError
        else:
            size = _YIELD_EVERY
            chunk, error = _take(items, size)
        return chunk, error if error is not None else len(chunk) == size

    def _reject(self, result: SeedResult, rejection: Rejection) -> None:
        self.summary.bad_urls += 1
        result.rejected += 1
        self.on_error(rejection)

    def _maybe_finished(self, result: SeedResult) -> None:
        if result.expanded and result.batches == 0:
            self.watcher.finished(result)

    async def settle(self) -> None:
        """Wait for the batch in flight and count what it did."""
        if self.in_flight is None:
            return
        (task, segments), self.in_flight = self.in_flight, None
        self._count(await task, segments)

    def _count(self, result: AddResult, segments: _Segments) -> None:
        """Add what one batch did to the run's and its seeds' counts."""
        self.summary.count(result)
        fresh, whole = result.fresh, len(result.fresh) == (segments[-1][2] if segments else 0)
        for seed, start, end in segments:
            seed.batches -= 1
            if whole:
                enqueued = sum(fresh[start:end])
                seed.enqueued += enqueued
                seed.duplicates += end - start - enqueued
            elif len(segments) == 1:  # (a writer that did not say which task was fresh)
                seed.enqueued += result.enqueued
                seed.duplicates += result.duplicates
            self._maybe_finished(seed)

    async def flush(self, current: SeedResult | None = None) -> None:
        """Send the batch (behind the one in flight); ``current``: the seed being expanded,
        whose tasks go on in the next batch."""
        batch, summary, options = self.batch, self.summary, self.options
        if not batch:
            return
        summary.expanded += len(batch)
        marks: list[tuple[SeedResult | None, int]] = [*self.segments, (None, len(batch))]
        segments: _Segments = [(seed, start, end) for (seed, start), (_, end)
                               in pairwise(marks) if end > start and seed is not None]
        self.segments = [(current, 0)] if current is not None else []
        if not options.dry_run:
            await self._send(list(batch), segments, current)
        batch.clear()
        if options.dry_run:
            for seed, _, _ in segments:
                self._maybe_finished(seed)
        if options.on_batch is not None:
            options.on_batch(summary)

    async def _send(self, batch: list[Encoded], segments: _Segments,
                    current: SeedResult | None = None) -> None:
        options, writer = self.options, self.writer
        if self.room < len(batch):
            await self.settle()  # (so that the look at the backlog counts the batch before)
            backlog = await writer.wait_for_room(options.max_backlog, options.on_wait)
            self.room = options.max_backlog - backlog
        self.room -= len(batch)
        await self.watcher.before_send()
        for seed, _, _ in segments:
            seed.batches += 1
        # The seed still being expanded is held (not finished between two of its batches); one
        # held before and ending in this batch is let go.
        holds: dict[str, bool] = {}
        for seed, _, _ in segments:
            if seed is current or seed.held:
                holds[seed.seed.seed_id] = seed.held = seed is current
        # Two batches going at once: this one is written behind the one before, on its
        # connection, before its reply is in (ScriptOrder): Redis never idles between them.
        self.order, task = await send_in_order(self.order, lambda order: writer.enqueue(
            batch, order, holds=holds) if holds else writer.enqueue(batch, order))
        try:
            await self.settle()
        except BaseException:
            # The one before failed (or this run is cancelled): this one was written already,
            # or is not sent at all; its reply is awaited, never left behind.
            await asyncio.wait([task])
            if not task.cancelled() and task.exception() is None:
                self._count(task.result(), segments)
            raise
        self.in_flight = (task, segments)


def _take(items: Iterator[Any], size: int) -> tuple[list[Any], SitemapError | None]:
    chunk: list[Any] = []
    try:
        chunk.extend(islice(items, size))  # (what came before a failing sitemap is kept)
    except SitemapError as exc:
        return chunk, exc
    return chunk, None


__all__ = ["expand_lines", "expand_seeds"]

"""Seeds (JSON Lines) to exec tasks, streaming: one line, one URL at a time, bounded memory.

Errors are data here, not exceptions that stop the run: a bad line is rejected with its line
number and reason, a bad URL inside a good line with its 0-based position in ``payload.urls``,
and everything else still goes to the stream.

Reading lines is :mod:`.seed_lines`, checking a seed's payload :mod:`.payload`, one seed's URLs
:mod:`.seed_urls`; :func:`expand_stream` puts them together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.batch_pipeline import SCRIPT_ORDER, ScriptOrder
from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.seeding.seed_lines import (
    SeedLineError,
    parse_seed_line,
)
from meteorseed_scrapy.seeding.seed_urls import UrlError, expand_checked
from meteorseed_scrapy.seeding.sitemap import SitemapError
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.enqueue_calls import AddResult, Encoded
    from meteorseed_scrapy.queue.writer import TaskWriter

logger = logging.getLogger(__name__)

#: URLs built between two yields to the event loop while a batch is in flight (other tasks of
#: the loop go on; a batch's scripts are written before its flush returns).
_YIELD_EVERY = 100


@dataclass(frozen=True)
class Rejection:
    """One rejected input: a whole line (``url_position`` None) or one URL of a line."""

    lineno: int
    reason: str
    url_position: int | None = None  # 0-based index in payload.urls

    def __str__(self) -> str:
        if self.url_position is None:
            return f"line {self.lineno}: {self.reason}"
        return f"line {self.lineno}, url {self.url_position}: {self.reason}"


@dataclass
class ExpandSummary:
    """Counts of one :func:`expand_stream` run (filled in as it goes)."""

    lines: int = 0
    expanded: int = 0  # valid tasks produced (sent, or counted by a dry run)
    enqueued: int = 0
    duplicates: int = 0
    bad_lines: int = 0
    bad_urls: int = 0

    @property
    def rejected(self) -> int:
        return self.bad_lines + self.bad_urls

    def count(self, result: AddResult) -> None:
        """Add what one batch's enqueue did."""
        self.enqueued += result.enqueued
        self.duplicates += result.duplicates

    def __str__(self) -> str:
        return (
            f"read {self.lines} lines, enqueued {self.enqueued}, "
            f"duplicates {self.duplicates}, rejected {self.rejected}"
        )


async def expand_stream(
    lines: Iterable[str | bytes],
    writer: TaskWriter,
    *,
    batch_size: int = 500,
    on_error: Callable[[Rejection], None],
    max_backlog: int = DEFAULTS["METEORSEED_MAX_BACKLOG"],
    dedup: bool = True,
    on_wait: Callable[[int], None] | None = None,
    summary: ExpandSummary | None = None,
    dry_run: bool = False,
    on_batch: Callable[[ExpandSummary], None] | None = None,
    rejects: Callable[[str, str], str | None] | None = None,
    sitemaps: Callable[[str], FetchPolicy] | None = None,
) -> ExpandSummary:
    """Expand JSON Lines seeds into exec tasks and enqueue them in batches of ``batch_size``.

    Line numbers start at 1; blank lines are skipped (but counted as read). Before each batch
    the writer waits while the stream's backlog is above ``max_backlog``, calling ``on_wait``.
    Pass ``summary`` to keep the counts when Redis fails half-way (the exception propagates).
    ``dry_run`` expands, validates and counts (``summary.expanded``) but sends nothing to
    Redis. ``on_batch`` is called after each batch (progress reports). ``rejects(site_id,
    url)`` says why a URL may not be enqueued for its site (outside its allowed domains, on its
    blacklist: see :meth:`~meteorseed_scrapy.sites.lookup.SiteConfigs.rejects`), or None.
    ``sitemaps(site_id)`` is how a site's sitemaps are fetched (default: the safe policy).

    While Redis runs one batch's script, the next batch is built, and sent behind it (in
    order, on the same connection) before its reply is in: Python's work and Redis's overlap
    instead of adding up, and Redis does not idle between two batches.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    summary = summary if summary is not None else ExpandSummary()
    batch: list[Encoded] = []
    in_flight: asyncio.Task[AddResult] | None = None
    order: ScriptOrder | None = None  # of the batch in flight
    # Tasks that may still be sent before the backlog must be looked at again: workers only
    # ever shrink it, so after a look showing room for N, N more cannot pass the limit. (One
    # look per batch was a round trip with Redis idle, for every 500 URLs.)
    room = 0

    async def settle() -> None:
        nonlocal in_flight
        if in_flight is not None:
            task, in_flight = in_flight, None
            summary.count(await task)

    async def flush() -> None:
        nonlocal in_flight, room, order
        if not batch:
            return
        summary.expanded += len(batch)
        if not dry_run:
            if room < len(batch):
                await settle()  # (so that the look at the backlog counts the batch before)
                backlog = await writer.wait_for_room(max_backlog, on_wait or _ignore_wait)
                room = max_backlog - backlog
            room -= len(batch)
            # Two batches going at once: this one is written to Redis behind the one before,
            # on its connection, before that one's reply is in (ScriptOrder), so Redis goes
            # from one to the next without waiting for a round trip and this one's packing.
            order = ScriptOrder(order)
            token = SCRIPT_ORDER.set(order)
            try:
                task = asyncio.ensure_future(writer.add_encoded(list(batch)))
            finally:
                SCRIPT_ORDER.reset(token)
            # (a writer whose add_encoded fails or returns before TaskWriter's: the next batch
            # must not wait for this one for ever)
            task.add_done_callback(_finisher(order))
            # (it goes out now, behind the one before)
            sent: list[asyncio.Future[Any]] = [order.sent, task]
            await asyncio.wait(sent, return_when=asyncio.FIRST_COMPLETED)
            try:
                await settle()
            except BaseException:
                # The one before failed (or this run is cancelled): this one was written
                # already, or is not sent at all; its reply is awaited, never left behind.
                await asyncio.wait([task])
                if not task.cancelled() and task.exception() is None:
                    summary.count(task.result())
                raise
            in_flight = task
        batch.clear()
        if on_batch is not None:
            on_batch(summary)

    def as_template(template: ExecTask) -> bool:
        return not writer.seed_encoder_reads_tasks(template, dedup)

    append = batch.append
    try:
        for lineno, seed in parse_lines(lines, on_error, summary):
            # The tasks of one seed share its site, lane, priority and meta: one encoder each.
            encode: Callable[[ExecTask, str, str], Encoded] | None = None
            try:
                # (task: the seed's template for most URLs, when the encoder reads no more)
                for position, item in enumerate(expand_checked(seed, sitemaps, as_template)):
                    if isinstance(item, UrlError):
                        summary.bad_urls += 1
                        on_error(Rejection(lineno, item.reason, item.position))
                        continue
                    task, canonical, payload, url = item
                    if rejects is not None:
                        reason = rejects(seed.site_id, url)
                        if reason is not None:
                            summary.bad_urls += 1
                            on_error(Rejection(lineno, f"url: {reason}", position))
                            continue
                    try:
                        if encode is None:
                            encode = writer.seed_encoder(task, dedup)
                        append(encode(task, canonical, payload))
                    except TaskError as exc:  # (expand checked these; a guard, not a path)
                        summary.bad_urls += 1
                        on_error(Rejection(lineno, str(exc)))
                        continue
                    if len(batch) >= batch_size:
                        await flush()
                    elif in_flight is not None and len(batch) % _YIELD_EVERY == 0:
                        await asyncio.sleep(0)
            except SitemapError as exc:
                summary.bad_lines += 1
                on_error(Rejection(lineno, str(exc)))
        await flush()
    finally:
        await settle()
    logger.debug("expand_stream done: %s", summary)
    return summary


def parse_lines(lines: Iterable[str | bytes], on_error: Callable[[Rejection], None],
                summary: ExpandSummary) -> Iterator[tuple[int, SeedTask]]:
    """``(line number, seed)`` of each valid seed line; a bad line is reported to ``on_error``
    and counted in ``summary.bad_lines``, every line (blank ones too) in ``summary.lines``."""
    for lineno, line in enumerate(lines, start=1):
        summary.lines += 1
        if not line or line.isspace():  # (isspace: no copy of a 2 MiB line)
            continue
        try:
            seed = parse_seed_line(line, lineno)
        except SeedLineError as exc:
            summary.bad_lines += 1
            on_error(Rejection(lineno, exc.reason))
            continue
        yield lineno, seed


def _ignore_wait(backlog: int) -> None:
    pass


def _finisher(order: ScriptOrder) -> Callable[[asyncio.Future[AddResult]], None]:
    def finish(task: asyncio.Future[AddResult]) -> None:
        order.finish(sent=not task.cancelled() and task.exception() is None)

    return finish


__all__ = ["ExpandSummary", "Rejection", "expand_stream", "parse_lines"]

"""What the expansion engine (:mod:`.expand`) takes and gives: its options, the rejections it
reports, the counts of a run and of each seed, and the watcher that learns of each seed."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.task.seed_task import SeedTask

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.enqueue.enqueue_calls import AddResult


@dataclass(frozen=True)
class Rejection:
    """One rejected input: a whole line or seed (``url_position`` None) or one of its URLs.
    ``lineno`` is where the seed came from: its line, or its place in the caller's list."""

    lineno: int
    reason: str
    url_position: int | None = None  # 0-based, in expansion order (url_list: payload.urls)

    def __str__(self) -> str:
        if self.url_position is None:
            return f"line {self.lineno}: {self.reason}"
        return f"line {self.lineno}, url {self.url_position}: {self.reason}"


@dataclass
class ExpandSummary:
    """Counts of one run of the engine (filled in as it goes)."""

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


@dataclass(frozen=True)
class ExpandOptions:
    """How the engine expands: the same for ``seed-expand``, ``POST /dispatch`` and the seeder.

    ``max_backlog``: before a batch, wait while more tasks than this wait in the streams,
    calling ``on_wait(backlog)``. ``dedup``: URL dedup (off: every task is enqueued).
    ``dry_run``: expand, validate and count, send nothing. ``rejects(site_id, url)``: why a
    URL may not be enqueued for its site (see
    :meth:`~meteorseed_scrapy.sites.lookup.SiteConfigs.rejects`), or None. ``sitemaps(site_id)``:
    how a site's sitemaps are fetched (default: the safe policy). ``on_batch(summary)``: after
    each batch (progress reports). ``threads``: pull each seed's URLs on threads (``executor``,
    default: the loop's), for seeds whose expansion blocks (a sitemap fetch, a big template),
    so the event loop goes on meanwhile.
    """

    batch_size: int = 500
    max_backlog: int = DEFAULTS["METEORSEED_MAX_BACKLOG"]
    dedup: bool = True
    dry_run: bool = False
    rejects: Callable[[str, str], str | None] | None = None
    sitemaps: Callable[[str], FetchPolicy] | None = None
    on_wait: Callable[[int], None] | None = None
    on_batch: Callable[[ExpandSummary], None] | None = None
    threads: bool = False
    executor: Executor | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_backlog"):
            value = getattr(self, name)
            if type(value) is not int or value < (1 if name == "batch_size" else 0):
                raise ValueError(f"{name}: must be an integer >= "
                                 f"{1 if name == 'batch_size' else 0}, got {value!r}")
        for name in ("dedup", "dry_run", "threads"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name}: must be True or False, got {getattr(self, name)!r}")


@dataclass
class SeedResult:
    """One seed's expansion, filled in as its batches are answered (a watcher holds it from
    :meth:`SeedWatcher.started`)."""

    seed: SeedTask
    lineno: int  # as in Rejection
    enqueued: int = 0
    duplicates: int = 0
    rejected: int = 0
    error: str | None = None  # the whole seed failed (its sitemap could not be read)
    batches: int = field(default=0, repr=False)  # its batches sent and not answered yet
    expanded: bool = field(default=False, repr=False)  # all its URLs are in a batch
    # A batch sent held it (more of its URLs to come): its progress is not finished until
    # a later batch, or the engine at its end, lets it go (queue/fleet/crawl_progress.py).
    held: bool = field(default=False, repr=False)


class SeedWatcher:
    """What a caller learns of each seed of a run; every hook is a no-op here."""

    def started(self, result: SeedResult) -> None:
        """A seed is about to be expanded (its counts fill in from now on)."""

    async def before_send(self) -> None:
        """Before each batch is sent (e.g. register the seeds started since the last one)."""

    def finished(self, result: SeedResult) -> None:
        """A seed is expanded and every batch holding its tasks was answered."""

    def stop_requested(self) -> bool:
        """True stops the run (``CancelledError``) before its next pull of URLs."""
        return False


__all__ = ["ExpandOptions", "ExpandSummary", "Rejection", "SeedResult", "SeedWatcher"]

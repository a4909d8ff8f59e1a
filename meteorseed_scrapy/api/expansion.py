"""Expanding one dispatched seed into exec tasks without blocking the server.

The expansion engine (:func:`meteorseed_scrapy.seeding.expand.expand_seeds`, the one
``seed-expand`` and the seeder run) with its URLs pulled on threads: a seed's URLs may block
(a sitemap is fetched over HTTP while it is iterated, a million-URL template takes seconds),
so they are pulled in chunks on a worker thread (for background expansions, a thread of the
:class:`ExpansionPool`, never one of the default executor that request handlers use), then
checked against the site's rules and enqueued (fleet-wide dedup, backpressure) on the event
loop. :class:`Progress` holds the counts so far, which
``GET /seeds/{id}`` shows while a background expansion runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from meteorseed_scrapy.api.problems import FieldError
from meteorseed_scrapy.queue.enqueue.enqueue_calls import CHUNK_SIZE
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.seeding.expand import expand_seeds
from meteorseed_scrapy.seeding.expand_types import (
    ExpandOptions,
    ExpandSummary,
    Rejection,
    SeedResult,
    SeedWatcher,
)
from meteorseed_scrapy.seeding.fetch import policies
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.task.seed_task import SeedTask

logger = logging.getLogger(__name__)

#: Seconds between two ``keepalive`` calls of a long expansion.
KEEPALIVE_S = 60.0
#: Rejected URLs listed in a response or a progress report (all are counted).
MAX_LISTED_ERRORS = 100
#: Seconds a dispatch refused for want of room in the :class:`ExpansionPool` is told to wait.
RETRY_AFTER_S = 30

#: Where a URL at expansion position N comes from, per task type (for the error's field path).
_URL_FIELDS = {
    "url_list": "payload.urls[{}]",
    "keywords": "payload.keywords[{}]",
    "url_template": "payload.template",
    "sitemap": "payload.url",
}


def url_field(seed: SeedTask, position: int) -> str:
    return _URL_FIELDS.get(seed.task_type, "payload").format(position)


class ExpansionState(str, Enum):
    """Where a seed's expansion by this server stands."""

    EXPANDING = "expanding"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class Progress:
    """Counts of one seed's expansion, filled in as it goes."""

    seed_id: str
    started_at: float = field(default_factory=time.time)
    state: ExpansionState = ExpansionState.EXPANDING
    finished_at: float | None = None
    enqueued: int = 0
    duplicates: int = 0
    rejected: int = 0
    errors: list[FieldError] = field(default_factory=list)
    error: str | None = None
    #: set by a cancel: the expansion stops at its next batch even if the cancellation itself
    #: was lost on the way (measured: a shutdown waited ~22 s, 1 time in 4, for the expansion
    #: to run to its end)
    stop_requested: bool = False

    def reject(self, path: str, problem: str) -> None:
        self.rejected += 1
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors.append(FieldError(path, problem))

    def finish(self, state: ExpansionState, error: str | None = None) -> None:
        self.state, self.error, self.finished_at = state, error, time.time()

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "enqueued": self.enqueued,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "errors": [e.to_json() for e in self.errors],
            "errors_truncated": self.rejected > len(self.errors),
            "error": self.error,
        }


class ExpansionPool:
    """The threads background expansions pull their URLs on, and the cap on how many run at
    once. Apart from the default executor (``asyncio.to_thread``: Redis reads of ``/status``,
    ``/dead-letters``, rule reloads), so slow sitemaps never keep a request handler waiting
    for a thread; one thread per running expansion, so none waits for another."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.running = 0  # slots taken (the event loop's thread only: no lock)
        self.executor = ThreadPoolExecutor(max_workers=size,
                                           thread_name_prefix="meteorseed-expansion")

    def reserve(self, count: int) -> bool:
        """Take ``count`` slots, all or none; False when there is not room for them all."""
        if self.running + count > self.size:
            return False
        self.running += count
        return True

    def release(self, count: int = 1) -> None:
        self.running = max(0, self.running - count)

    def shutdown(self) -> None:
        # A fetch under way ends at its deadline, or at once when its expansion's stop is set.
        self.executor.shutdown(wait=False, cancel_futures=True)


class _ProgressWatcher(SeedWatcher):
    """The one seed of a dispatch expansion: its result, and a stop asked for by a cancel."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.result: SeedResult | None = None

    def started(self, result: SeedResult) -> None:
        self.result = result

    def stop_requested(self) -> bool:
        return self.progress.stop_requested


async def expand_seed(seed: SeedTask, prefix: str, progress: Progress, writer: TaskWriter,
                      rules: SiteConfigs, max_backlog: int,
                      keepalive: Callable[[], Awaitable[None]] | None = None, *,
                      pool: ExpansionPool | None = None, private_addresses: bool = False
                      ) -> tuple[ExpansionState, str | None]:
    """Expand ``seed`` into the task stream (the expansion engine, URLs pulled on threads),
    recording counts and rejections in ``progress``; returns the outcome (``done`` or
    ``failed``) and why it failed, for the caller to record and then :meth:`Progress.finish`
    (in that order: a reader seeing ``done`` sees the run).

    ``prefix`` starts every field path (``seeds[2].``). ``keepalive`` is awaited every
    :data:`KEEPALIVE_S` seconds (the seed's lease). A sitemap that cannot be read fails the
    expansion; Redis errors propagate with the counts kept so far. ``pool``: the threads to
    pull URLs on (default: the default executor); ``private_addresses``:
    ``METEORSEED_FETCH_PRIVATE_ADDRESSES``.
    """
    await rules.refresh()
    summary = ExpandSummary()

    def counted(summary: ExpandSummary) -> None:
        progress.enqueued, progress.duplicates = summary.enqueued, summary.duplicates

    def rejected(rejection: Rejection) -> None:
        position = rejection.url_position
        if position is None:  # the whole seed: its sitemap
            progress.reject(f"{prefix}payload.url", rejection.reason)
            return
        problem = rejection.reason
        if seed.task_type in ("url_template", "sitemap"):
            problem = f"URL #{position}: {problem}"
        progress.reject(prefix + url_field(seed, position), problem)

    options = ExpandOptions(
        batch_size=CHUNK_SIZE, max_backlog=max_backlog, dedup=True, rejects=rules.rejects,
        sitemaps=policies(rules.get, private_addresses), on_wait=_waiting, on_batch=counted,
        threads=True, executor=None if pool is None else pool.executor)
    watcher = _ProgressWatcher(progress)
    done = asyncio.Event()
    lease = asyncio.ensure_future(_keep(keepalive, done)) if keepalive is not None else None
    try:
        await expand_seeds([(0, seed)], writer, options, on_error=rejected, watcher=watcher,
                           summary=summary)
    finally:
        counted(summary)
        if lease is not None:
            done.set()  # (a cancel landing inside a Redis command can be swallowed: see _keep)
            lease.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lease
    error = watcher.result.error if watcher.result is not None else None
    return (ExpansionState.DONE, None) if error is None else (ExpansionState.FAILED, error)


async def _keep(keepalive: Callable[[], Awaitable[None]], done: asyncio.Event) -> None:
    """The seed's lease, renewed while a long expansion runs (a Redis that is down fails the
    expansion itself: here it is only logged), until ``done``. The event, not only the cancel,
    ends it: redis-py 8.2 can swallow a cancellation that lands while a command is in flight,
    and the loop would then renew for ever while its caller waits for it to end."""
    while not done.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(done.wait(), KEEPALIVE_S)
        if done.is_set():
            return
        try:
            await keepalive()
        except Exception as exc:  # (the registry shares Redis: it may be down too)
            logger.warning("cannot renew the lease of a seed being expanded: %s", exc)


def _waiting(backlog: int) -> None:
    logger.info("dispatch waits: %d tasks waiting in the stream, above METEORSEED_MAX_BACKLOG",
                backlog)

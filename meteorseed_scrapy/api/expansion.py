"""Expanding one dispatched seed into exec tasks without blocking the server.

The URL generator of a seed (:func:`meteorseed_scrapy.seeding.expand.expand`) may block: a
sitemap is fetched over HTTP while it is iterated, a million-URL template takes seconds. So it
is pulled in chunks in a worker thread (for background expansions, a thread of the
:class:`ExpansionPool`, never one of the default executor that request handlers use), and
each chunk is checked against the site's rules and
enqueued through :class:`~meteorseed_scrapy.queue.writer.TaskWriter` (fleet-wide dedup,
backpressure) on the event loop. :class:`Progress` holds the counts so far, which
``GET /seeds/{id}`` shows while a background expansion runs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

from meteorseed_scrapy.api.problems import FieldError
from meteorseed_scrapy.queue.enqueue_calls import CHUNK_SIZE, Encoded
from meteorseed_scrapy.queue.writer import TaskWriter
from meteorseed_scrapy.seeding.fetch import FetchPolicy, policies
from meteorseed_scrapy.seeding.seed_urls import UrlError, cached_canonical_url, expand
from meteorseed_scrapy.seeding.sitemap import SitemapError
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

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


@dataclass
class Progress:
    """Counts of one seed's expansion, filled in as it goes."""

    seed_id: str
    started_at: float = field(default_factory=time.time)
    state: str = "expanding"  # expanding | done | failed | cancelled
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

    def finish(self, state: str, error: str | None = None) -> None:
        self.state, self.error, self.finished_at = state, error, time.time()

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
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


def _take(items: Iterator[ExecTask | UrlError], n: int) -> list[ExecTask | UrlError]:
    return list(islice(items, n))


async def expand_seed(seed: SeedTask, prefix: str, progress: Progress, writer: TaskWriter,
                      rules: SiteConfigs, max_backlog: int,
                      keepalive: Callable[[], Awaitable[None]] | None = None, *,
                      pool: ExpansionPool | None = None, private_addresses: bool = False
                      ) -> tuple[str, str | None]:
    """Expand ``seed`` into the task stream, recording counts and rejections in ``progress``;
    returns the outcome (``done`` or ``failed``) and why it failed, for the caller to record
    and then :meth:`Progress.finish` (in that order: a reader seeing ``done`` sees the run).

    ``prefix`` starts every field path (``seeds[2].``). ``keepalive`` is awaited every
    :data:`KEEPALIVE_S` seconds (the seed's lease). A sitemap that cannot be read fails the
    expansion; Redis errors propagate with the counts kept so far. ``pool``: the threads to
    pull URLs on (default: the default executor); ``private_addresses``:
    ``METEORSEED_FETCH_PRIVATE_ADDRESSES``.
    """
    await rules.refresh()
    stop = threading.Event()  # set when this ends: a sitemap fetch still under way stops too
    site_policy = policies(rules.get, private_addresses)

    def sitemaps(site_id: str) -> FetchPolicy:
        return replace(site_policy(site_id), stop=stop)

    items = expand(seed, sitemaps)  # the payload was checked when the request was validated
    loop = asyncio.get_running_loop()
    next_keepalive = time.monotonic() + KEEPALIVE_S
    try:
        while True:
            if keepalive is not None and time.monotonic() >= next_keepalive:
                await keepalive()
                next_keepalive = time.monotonic() + KEEPALIVE_S
            if progress.stop_requested:
                raise asyncio.CancelledError
            chunk = await (asyncio.to_thread(_take, items, CHUNK_SIZE) if pool is None else
                           loop.run_in_executor(pool.executor, _take, items, CHUNK_SIZE))
            if not chunk or progress.stop_requested:
                if progress.stop_requested:
                    raise asyncio.CancelledError
                break
            batch = _encode(seed, prefix, chunk, progress, writer, rules)
            if batch:
                await writer.wait_for_room(max_backlog, _waiting)
                result = await writer.add_encoded(batch)
                progress.enqueued += result.enqueued
                progress.duplicates += result.duplicates
    except SitemapError as exc:
        progress.reject(f"{prefix}payload.url", str(exc))
        return "failed", str(exc)
    finally:
        stop.set()
    return "done", None


def _encode(seed: SeedTask, prefix: str, chunk: list[ExecTask | UrlError], progress: Progress,
            writer: TaskWriter, rules: SiteConfigs) -> list[Encoded]:
    batch: list[Encoded] = []
    for position, item in enumerate(chunk, start=progress.enqueued + progress.duplicates
                                    + progress.rejected):
        if isinstance(item, UrlError):
            position = item.position
            path, problem = url_field(seed, position), item.reason
        else:
            reason = rules.rejects(seed.site_id, item.url)
            if reason is None:
                try:
                    batch.append(writer.encode(item, True, cached_canonical_url(item.url)))
                    continue
                except TaskError as exc:  # (expand checked these; a guard)
                    reason = str(exc)
            path, problem = url_field(seed, position), f"url: {reason}"
        if seed.task_type in ("url_template", "sitemap"):
            problem = f"URL #{position}: {problem}"
        progress.reject(prefix + path, problem)
    return batch


def _waiting(backlog: int) -> None:
    logger.info("dispatch waits: %d tasks waiting in the stream, above METEORSEED_MAX_BACKLOG",
                backlog)

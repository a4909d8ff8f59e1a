"""Expanding one dispatched seed into exec tasks without blocking the server.

The URL generator of a seed (:func:`meteorseed_scrapy.seeding.expand.expand`) may block: a
sitemap is fetched over HTTP while it is iterated, a million-URL template takes seconds. So it
is pulled in chunks in a worker thread, and each chunk is checked against the site's rules and
enqueued through :class:`~meteorseed_scrapy.queue.writer.TaskWriter` (fleet-wide dedup,
backpressure) on the event loop. :class:`Progress` holds the counts so far, which
``GET /seeds/{id}`` shows while a background expansion runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from meteorseed_scrapy.api.problems import FieldError
from meteorseed_scrapy.queue.writer import CHUNK_SIZE, Encoded, TaskWriter
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


def _take(items: Iterator[ExecTask | UrlError], n: int) -> list[ExecTask | UrlError]:
    return list(islice(items, n))


async def expand_seed(seed: SeedTask, prefix: str, progress: Progress, writer: TaskWriter,
                      rules: SiteConfigs, max_backlog: int,
                      keepalive: Callable[[], Awaitable[None]] | None = None
                      ) -> tuple[str, str | None]:
    """Expand ``seed`` into the task stream, recording counts and rejections in ``progress``;
    returns the outcome (``done`` or ``failed``) and why it failed, for the caller to record
    and then :meth:`Progress.finish` (in that order: a reader seeing ``done`` sees the run).

    ``prefix`` starts every field path (``seeds[2].``). ``keepalive`` is awaited every
    :data:`KEEPALIVE_S` seconds (the seed's lease). A sitemap that cannot be read fails the
    expansion; Redis errors propagate with the counts kept so far.
    """
    await rules.refresh()
    items = expand(seed)  # the payload was checked when the request was validated
    next_keepalive = time.monotonic() + KEEPALIVE_S
    try:
        while True:
            if keepalive is not None and time.monotonic() >= next_keepalive:
                await keepalive()
                next_keepalive = time.monotonic() + KEEPALIVE_S
            if progress.stop_requested:
                raise asyncio.CancelledError
            chunk = await asyncio.to_thread(_take, items, CHUNK_SIZE)
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

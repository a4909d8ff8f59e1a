"""Which task (and which scrape of it) the code running now works for.

The scheduler sets :data:`CURRENT_SCRAPE` around ``Scraper.enqueue_scrape``; the asyncio tasks
that Scrapy creates there (callback output, item pipelines, item signals) inherit it, so the
store stage knows the task of each item without Scrapy passing the response along. It is *not*
a way to tell retry/redirect hops from child requests: the context also leaks into downloads
started from a scrape pass.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from meteorseed_scrapy.task.exec_task import ExecTask

TASK_META_KEY = "meteorseed_task"
LEASE_META_KEY = "meteorseed_lease"  # the concurrency lease a request was dispatched with


@dataclass(eq=False)
class Scrape:
    """One final hop of one task: what its callback produced and what was committed."""

    task: ExecTask
    committed: int = 0
    keyless_items: int = 0
    errors: list[str] = field(default_factory=list)
    _digest: Any = field(default_factory=hashlib.sha256)

    def record_commit(self, doc_id: str, content: str) -> None:
        """Called by the store stage once a document is durably written."""
        self.committed += 1
        self._digest.update(doc_id.encode("utf-8"))
        self._digest.update(b"\0")
        self._digest.update(content.encode("utf-8"))
        self._digest.update(b"\0")

    def fail(self, reason: str) -> None:
        self.errors.append(reason)

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()


CURRENT_SCRAPE: ContextVar[Scrape | None] = ContextVar("meteorseed_current_scrape", default=None)


def current_scrape() -> Scrape | None:
    return CURRENT_SCRAPE.get()


def task_of(obj: Any) -> ExecTask | None:
    """The task carried by a Request, Response or Failure (via ``request.meta``), if any."""
    request = getattr(obj, "request", obj)
    meta = getattr(request, "meta", None)
    if meta is None:
        value = getattr(obj, "value", None)  # a Failure whose exception carries the request
        meta = getattr(getattr(value, "request", None), "meta", None)
    task = meta.get(TASK_META_KEY) if meta else None
    return task if isinstance(task, ExecTask) else None

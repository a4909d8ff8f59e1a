"""Requests yielded by a callback (or by ``start()``) become new tasks: checked, deduplicated
by the project's ``DUPEFILTER_CLASS`` (:mod:`.duplicates`), queued to be written to the stream
(:mod:`.children`) before their parent may be acked; a duplicate is reported once written.

How many children a task's callback may make is :mod:`.children_cap`'s to say, before its
requests get here. The children of a task from the API keep its address mark
(:mod:`~meteorseed_scrapy.address_policy`): a link on such a page is outside input too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy import Request, Spider

from meteorseed_scrapy.queue.enqueue.writer import FingerprintError
from meteorseed_scrapy.seeding.addresses import POLICY_META_KEY, PUBLIC_ONLY
from meteorseed_scrapy.task.context import Scrape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.duplicates import Duplicates
from meteorseed_scrapy.worker.ledger import TaskLedger
from meteorseed_scrapy.worker.requests import request_to_task
from meteorseed_scrapy.worker.start_pacing import StartPacing
from meteorseed_scrapy.worker.waiting import ComingTasks

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class YieldedRequests:
    def __init__(self, crawler: Crawler, spider: Spider | None, ledger: TaskLedger,
                 completions: Completions, pacing: StartPacing, coming: ComingTasks,
                 reads_started: Callable[[], int]) -> None:
        self._spider = spider
        self._stats = crawler.stats
        self._ledger = ledger
        self._completions = completions
        self._pacing = pacing
        self._coming = coming  # this worker's new tasks on their way through the stream
        self._reads_started = reads_started
        self.dupes = Duplicates(crawler, spider)  # (refuses a DUPEFILTER_CLASS it cannot honour)
        self._deduped: dict[str, Request] = {}  # task id -> request, until written
        self.written_mark = -1  # reads started when new children were last written

    def child(self, scrape: Scrape | None, request: Request) -> bool:
        """A request yielded by ``scrape``'s callback (None: by ``start()``) becomes a new task,
        written to the stream before its parent may be acked. False, and the parent's scrape
        failed, when it cannot be a task (the error names the field); False too when the
        project's own ``DUPEFILTER_CLASS`` says it is a duplicate (:mod:`.duplicates`)."""
        parent = scrape.task if scrape is not None else None
        if parent is not None and parent.meta.get(POLICY_META_KEY) == PUBLIC_ONLY:
            request.meta[POLICY_META_KEY] = PUBLIC_ONLY
        try:
            task = request_to_task(request, self._spider, parent)
            if self.dupes.seen_here(request):
                return False
            dedup = self.dupes.dedup(request)
            # (encoded now, dedup key too, where the error can name the request)
            self._completions.child(task, scrape, dedup)
            self._coming.added(task)
        except TaskError as exc:
            if scrape is None and isinstance(exc, FingerprintError):
                raise  # as Scrapy's scheduler: the engine stops reading start()
            logger.error("Cannot make a task of %s: %s", request, exc)
            self._stats.inc_value("meteorseed/children/rejected")
            if scrape is not None:
                scrape.fail(f"yielded request {request.url}: {exc}")
            return False
        if parent is not None:
            self._ledger.child_added(parent.task_id)
        else:
            self._pacing.enqueued(request, task)
        if dedup:  # (a duplicate is reported with its request once written)
            self._deduped[task.task_id] = request
        return True

    def written(self, tasks: list[ExecTask], fresh: tuple[bool, ...]) -> None:
        """``tasks`` were written (``fresh``: each was new, else a duplicate, not written)."""
        if any(fresh):
            self.written_mark = self._reads_started()
        self._coming.written(tasks, fresh)
        for task, new in zip(tasks, fresh, strict=True):
            request = self._deduped.pop(task.task_id, None)
            if request is not None and not new:
                self.dupes.dropped(request)
        self._pacing.written(tasks, fresh)


__all__ = ["YieldedRequests"]

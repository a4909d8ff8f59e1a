"""How a scraped task ends: its :class:`~meteorseed_scrapy.worker.ledger.Outcome` and reason, judged
from what the download and the scrape produced."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.python.failure import Failure

from meteorseed_scrapy.task.exceptions import TaskDeferred
from meteorseed_scrapy.task.lanes import RETRY_LANE
from meteorseed_scrapy.worker.ledger import Entry, Outcome
from meteorseed_scrapy.worker.requests import status_allowed


def judge(entry: Entry, result: Response | Failure, request: Request, spider: Spider | None,
          settings: Any, stats: Any) -> tuple[Outcome, str]:
    """The outcome of ``entry``'s task; a deferral is noted on ``entry`` (delay, task, lane)."""
    if isinstance(result, Failure):
        deferred = result.check(TaskDeferred) and result.value
        if isinstance(deferred, TaskDeferred):
            task = entry.task
            if deferred.count_retry:
                task = replace(task, retry_count=task.retry_count + 1)
            entry.defer_s, entry.defer_task = deferred.delay_s, task
            # A durable retry waits in the retry lane; a pause goes back to its own lane.
            entry.defer_lane = RETRY_LANE if deferred.count_retry else ""
            return Outcome.DEFERRED, deferred.reason
        if result.check(IgnoreRequest):
            return Outcome.IGNORED, f"ignored: {result.getErrorMessage()}"
        retries = request.meta.get("retry_times", 0) + entry.task.retry_count
        error = f"{type(result.value).__name__}: {result.getErrorMessage()}"
        return Outcome.DEAD, f"download failed after {retries} retries: {error}"[:2000]
    entry.status = result.status
    if result.status < 400 or status_allowed(result.status, request, spider, settings):
        return Outcome.DONE, ""
    if result.status in (404, 410):
        stats.inc_value(f"meteorseed/gone/{result.status}")
        return Outcome.GONE, f"HTTP {result.status}"
    retries = request.meta.get("retry_times", 0) + entry.task.retry_count
    return Outcome.DEAD, f"HTTP {result.status} after {retries} retries"


__all__ = ["judge"]

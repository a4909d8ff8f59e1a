"""How a scraped task ends: its :class:`Outcome` and reason, judged from what the download and
the scrape produced."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.python.failure import Failure

from meteorseed_scrapy.politeness.breaker import Breaker
from meteorseed_scrapy.store.base import StoreUnavailable
from meteorseed_scrapy.task.context import Scrape
from meteorseed_scrapy.task.exceptions import DeferReason, TaskDeferred, TaskGivenUp
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.lanes import RETRY_LANE
from meteorseed_scrapy.worker.requests import status_allowed


class Outcome(Enum):
    DONE = "done"  # items committed, children durable: ack with a completion record
    GONE = "gone"  # 404/410: terminal, acked
    IGNORED = "ignored"  # IgnoreRequest / dropped: terminal, acked
    DEAD = "dead"  # download failed for good, or a bug in the spider: dead-lettered
    FAILED = "failed"  # an error that may pass (store down): left pending, redelivered later
    DEFERRED = "deferred"  # 429 pause, 5xx/timeout retry: durably put back for later


#: Why a task waits when its site is in trouble: such waits end by the site's give-up time.
TROUBLE = frozenset({DeferReason.SICK, DeferReason.PAUSED, DeferReason.PRIORITY})
GIVE_UP_SLACK_S = 1.0  # back this long after the give-up time, to find it passed

#: Errors that may pass (see :func:`transient`); redis-py's own do not derive from OSError.
TRANSIENT: tuple[type[BaseException], ...] = (
    StoreUnavailable, ConnectionError, TimeoutError, asyncio.TimeoutError,
    RedisConnectionError, RedisTimeoutError,
)

#: Outcomes whose task's items (if any) were committed and which are acked.
COMMITTED = frozenset({Outcome.DONE, Outcome.GONE, Outcome.IGNORED})


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str = ""
    status: int = 0  # the final hop's HTTP status (0: no response)
    defer_s: float = 0.0  # for DEFERRED: when to try again
    defer_task: ExecTask | None = None  # for DEFERRED: the task to put back (retry_count)
    defer_lane: str = ""  # for DEFERRED: the lane it goes back to ("" = its own)
    defer_why: DeferReason = DeferReason.OTHER  # for DEFERRED: recorded in the delayed set


def judge(task: ExecTask, result: Response | Failure, request: Request, spider: Spider | None,
          settings: Any, stats: Any) -> Verdict:
    """The verdict on ``task`` after its final hop ended with ``result``."""
    if isinstance(result, Failure):
        deferred = result.check(TaskDeferred) and result.value
        if isinstance(deferred, TaskDeferred):
            again = task
            if deferred.count_retry:
                again = replace(task, retry_count=task.retry_count + 1)
            # A durable retry waits in the retry lane; a pause goes back to its own lane.
            return Verdict(Outcome.DEFERRED, deferred.reason, defer_s=deferred.delay_s,
                           defer_task=again,
                           defer_lane=RETRY_LANE if deferred.count_retry else "",
                           defer_why=deferred.why)
        given_up = result.check(TaskGivenUp) and result.value
        if isinstance(given_up, TaskGivenUp):
            return Verdict(Outcome.DEAD, given_up.reason)
        if result.check(IgnoreRequest):
            return Verdict(Outcome.IGNORED, f"ignored: {result.getErrorMessage()}")
        retries = request.meta.get("retry_times", 0) + task.retry_count
        error = f"{type(result.value).__name__}: {result.getErrorMessage()}"
        return Verdict(Outcome.DEAD, f"download failed after {retries} retries: {error}"[:2000])
    status = result.status
    if status < 400 or status_allowed(status, request, spider, settings):
        return Verdict(Outcome.DONE, status=status)
    if status in (404, 410):
        stats.inc_value(f"meteorseed/gone/{status}")
        return Verdict(Outcome.GONE, f"HTTP {status}", status=status)
    retries = request.meta.get("retry_times", 0) + task.retry_count
    return Verdict(Outcome.DEAD, f"HTTP {status} after {retries} retries", status=status)


def handled(verdict: Verdict, request: Request, output: bool) -> Verdict:
    """A task dead at its final failure whose errback returned items or requests (``output``)
    handled that failure, as in Scrapy: done, acked with its output."""
    if verdict.outcome is Outcome.DEAD and output and request.errback is not None:
        return Verdict(Outcome.DONE, f"handled by the errback: {verdict.reason}",
                       status=verdict.status)
    return verdict


def transient(error: BaseException | None) -> bool:
    """Whether ``error`` (or one it was raised from) may pass: the store, or a service the
    spider's code calls, out of reach for a while. Anything else raised by the spider's code
    (callback, errback, item pipeline) is a bug that a redelivery would meet again, after
    fetching the page again."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, TRANSIENT):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def after_scrape(verdict: Verdict, scrape: Scrape | None) -> Verdict:
    """The verdict on a task whose final hop was judged ``verdict``, once its scrape's errors
    (an item not committed, a callback or errback error, a yielded request that cannot be
    written) are known; the task settles only once the rest of its output is through.

    Errors that may all pass (:func:`transient`): FAILED, delivered again (up to
    ``METEORSEED_MAX_DELIVERIES``). Any other: DEAD at once, the errors as its reason: as on
    Scrapy, a bug in the spider does not fetch the page again (Scrapy logs it and goes on;
    here the task is kept, dead-lettered, to requeue once the spider is fixed)."""
    if scrape is None or not scrape.errors:
        return verdict
    errors = "; ".join(scrape.errors)
    if verdict.outcome is Outcome.DEAD:
        return replace(verdict, reason=f"{verdict.reason}; {errors}"[:2000])
    outcome = Outcome.DEAD if scrape.lasting else Outcome.FAILED
    return replace(verdict, outcome=outcome, reason=errors[:2000])


def trouble_wait(breaker: Breaker, stats: Any, site: str, delay_s: float, why: DeferReason
                 ) -> tuple[str, float]:
    """For a task going back to wait: ``(reason, delay)``. A task whose site is in trouble
    (sick, paused, or parked for a sick site's priorities) is given up on, ``reason`` saying
    since when, once the trouble lasted ``METEORSEED_GIVE_UP_AFTER``; until then it comes back
    no later than just after that time, so that it is dead-lettered on time (and a batch crawl
    ends). ``reason`` is "" when it waits as asked."""
    if why not in TROUBLE:
        return "", delay_s
    reason = breaker.given_up(site)
    if reason:
        stats.inc_value(f"meteorseed/given_up/{site}")
    left = breaker.give_up_in(site)
    if reason or left is None:
        return reason, delay_s
    return "", min(delay_s, left + GIVE_UP_SLACK_S)


__all__ = ["COMMITTED", "TRANSIENT", "TROUBLE", "Outcome", "Verdict", "after_scrape", "handled",
           "judge", "transient", "trouble_wait"]

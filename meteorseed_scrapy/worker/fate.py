"""A task's fate, decided in one place: how a task can end (:class:`Outcome`, :class:`Verdict`);
:func:`on_delivery` judges a task as it is delivered, before it starts; :func:`fate` takes what
happened to it and returns its verdict; :func:`settled_now` says whether it is settled yet. Also
which errors may pass (:func:`transient`) and how long a task of a site in trouble may wait
(:func:`trouble_wait`).

All are functions of their arguments (no Redis, no stats, no clock; :func:`trouble_wait` reads
the breaker's state of the site in memory): the pump gathers the facts (:func:`what_happened`,
the scrape's errors as they stand), acts on the verdict and counts it; the ledger only counts
children, the completions only write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.python.failure import Failure

from meteorseed_scrapy.politeness.breaker import Breaker
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN
from meteorseed_scrapy.store.base import StoreUnavailable
from meteorseed_scrapy.task.exceptions import IGNORED_PREFIX, DeferReason, TaskDeferred, TaskGivenUp
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.lanes import RETRY_LANE
from meteorseed_scrapy.worker.requests import status_allowed

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

class Outcome(Enum):
    DONE = "done"  # items committed, children durable: ack with a completion record
    GONE = "gone"  # 404/410: terminal, acked
    IGNORED = "ignored"  # IgnoreRequest / dropped: terminal, acked
    DEAD = "dead"  # download failed for good, or a bug in the spider: dead-lettered
    FAILED = "failed"  # an error that may pass (store down): left pending, redelivered later
    DEFERRED = "deferred"  # 429 pause, 5xx/timeout retry: durably put back for later
    CANCELLED = "cancelled"  # its seed was cancelled: acked unfetched (worker/seed_holds.py)


#: Why a task waits when its site is in trouble: such waits end by the site's give-up time.
TROUBLE = frozenset({DeferReason.SICK, DeferReason.PAUSED, DeferReason.PRIORITY})
GIVE_UP_SLACK_S = 1.0  # back this long after the give-up time, to find it passed

#: Errors that may pass (see :func:`transient`); redis-py's own do not derive from OSError.
TRANSIENT: tuple[type[BaseException], ...] = (
    StoreUnavailable, ConnectionError, TimeoutError, asyncio.TimeoutError, *REDIS_DOWN,
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


def trouble_wait(breaker: Breaker, site: str, delay_s: float, why: DeferReason
                 ) -> tuple[str, float]:
    """For a task going back to wait: ``(reason, delay)``. A task whose site is in trouble
    (sick, paused, or parked for a sick site's priorities) is given up on, ``reason`` saying
    since when, once the trouble lasted ``METEORSEED_GIVE_UP_AFTER``; until then it comes back
    no later than just after that time, so that it is dead-lettered on time (and a batch crawl
    ends). ``reason`` is "" when it waits as asked."""
    if why not in TROUBLE:
        return "", delay_s
    reason = breaker.given_up(site)
    left = breaker.give_up_in(site)
    if reason or left is None:
        return reason, delay_s
    return "", min(delay_s, left + GIVE_UP_SLACK_S)


REASON_MAX = 2000  # characters of a reason (a dead letter's, a failure note's)


def on_delivery(error: str, deliveries: int, max_deliveries: int, committed: bool,
                last_failure: str = "") -> Verdict | None:
    """The verdict on a task as it is delivered, before it starts (None: it starts). A message
    that is no task (``error``, why): dead. One whose completion record exists (``committed``
    before its worker died, not acked): done, acked without a refetch. One delivered more than
    ``max_deliveries`` times: dead, saying its ``last_failure``."""
    if error:
        return Verdict(Outcome.DEAD, error)
    if committed:
        return Verdict(Outcome.DONE, "committed before a redelivery")
    if deliveries > max_deliveries:
        return Verdict(Outcome.DEAD, (
            f"delivered {deliveries} times, more than METEORSEED_MAX_DELIVERIES="
            f"{max_deliveries}; last failure: "
            f"{last_failure or 'no failure recorded (worker died?)'}")[:REASON_MAX])
    return None


@dataclass(frozen=True)
class WhatHappened:
    """The facts about one task, from its final hop to its scrape's errors."""

    task: ExecTask
    result: Response | Failure | None = None  # the final hop's (None: it never got one)
    retry_times: int = 0  # Scrapy's own retries of the final hop (meta["retry_times"])
    status_allowed: bool = False  # the spider handles the response's error status itself
    errback: bool = False  # the request has an errback
    output: bool = False  # the final hop yielded items or requests, with no error by then
    given_up: str = ""  # the site's trouble lasted too long: why the wait ended
    defer_s: float | None = None  # a deferral's wait, capped by the site's give-up time
    unusable: str = ""  # the task could not become a request: why
    errors: tuple[str, ...] = ()  # the scrape's errors as they stand
    lasting: bool = False  # one of them would happen again on a redelivery


def fate(happened: WhatHappened) -> Verdict:
    """How the task ends: the final hop's verdict (:func:`final_hop`), an errback's output
    handling a final failure, a deferral given up on, then the scrape's errors."""
    if happened.unusable:
        return Verdict(Outcome.DEAD, f"bad task: {happened.unusable}")
    if happened.result is None:  # never scraped: given up on while it waited, or nothing known
        return Verdict(Outcome.DEAD, happened.given_up) if happened.given_up else Verdict(
            Outcome.FAILED)
    verdict = final_hop(happened)
    if verdict.outcome is Outcome.DEAD and happened.output and happened.errback:
        # The errback handled the failure, as in Scrapy: done, acked with its output.
        verdict = Verdict(Outcome.DONE, f"handled by the errback: {verdict.reason}",
                          status=verdict.status)
    if verdict.outcome is Outcome.DEFERRED:
        if happened.given_up:
            verdict = Verdict(Outcome.DEAD, happened.given_up, status=verdict.status)
        elif happened.defer_s is not None:
            verdict = replace(verdict, defer_s=happened.defer_s)
    return after_scrape(verdict, happened.errors, happened.lasting)


def final_hop(happened: WhatHappened) -> Verdict:
    """The verdict on the task from its final hop's result alone."""
    task, result = happened.task, happened.result
    retries = happened.retry_times + task.retry_count
    if isinstance(result, Failure):
        deferred = result.value
        if isinstance(deferred, TaskDeferred):
            again = task
            if deferred.count_retry:
                again = replace(task, retry_count=task.retry_count + 1)
            # A durable retry waits in the retry lane; a pause goes back to its own lane.
            return Verdict(Outcome.DEFERRED, deferred.reason, defer_s=deferred.delay_s,
                           defer_task=again,
                           defer_lane=RETRY_LANE if deferred.count_retry else "",
                           defer_why=deferred.why)
        if isinstance(result.value, TaskGivenUp):
            return Verdict(Outcome.DEAD, result.value.reason)
        if isinstance(result.value, IgnoreRequest):
            return Verdict(Outcome.IGNORED, f"{IGNORED_PREFIX}{result.getErrorMessage()}")
        error = f"{type(result.value).__name__}: {result.getErrorMessage()}"
        return Verdict(Outcome.DEAD,
                       f"download failed after {retries} retries: {error}"[:REASON_MAX])
    if result is None:
        return Verdict(Outcome.FAILED)
    status = result.status
    if status < 400 or happened.status_allowed:
        return Verdict(Outcome.DONE, status=status)
    if status in (404, 410):
        return Verdict(Outcome.GONE, f"HTTP {status}", status=status)
    return Verdict(Outcome.DEAD, f"HTTP {status} after {retries} retries", status=status)


def after_scrape(verdict: Verdict, errors: tuple[str, ...], lasting: bool) -> Verdict:
    """``verdict`` once the scrape's errors (an item not committed, a callback or errback
    error, a yielded request that cannot be written) are known.

    Errors that may all pass (:func:`transient`): FAILED, delivered again (up to
    ``METEORSEED_MAX_DELIVERIES``). Any other: DEAD at once, the errors as its reason: as on
    Scrapy, a bug in the spider does not fetch the page again (Scrapy logs it and goes on;
    here the task is kept, dead-lettered, to requeue once the spider is fixed)."""
    if not errors:
        return verdict
    joined = "; ".join(errors)
    if verdict.outcome is Outcome.DEAD:
        return replace(verdict, reason=f"{verdict.reason}; {joined}"[:REASON_MAX])
    outcome = Outcome.DEAD if lasting else Outcome.FAILED
    return replace(verdict, outcome=outcome, reason=joined[:REASON_MAX])


def settled_now(happened: WhatHappened | None, children_pending: int) -> Verdict | None:
    """The verdict on a task settled now, or None while it is not: its final hop is not
    processed yet, or its children are not all durable yet (a failed task settles at once: it
    will not be acked, so its children need not wait)."""
    if happened is None:
        return None
    verdict = fate(happened)
    if children_pending > 0 and verdict.outcome is not Outcome.FAILED:
        return None
    return verdict


def what_happened(task: ExecTask, request: Request, result: Response | Failure, *,
                  spider: Spider | None, settings: BaseSettings, output: bool,
                  trouble: Callable[[float, DeferReason], tuple[str, float]]) -> WhatHappened:
    """The facts of ``task``'s final hop; ``trouble(delay, why)`` is the site's say on a
    deferral (:func:`trouble_wait`): ``(why it is given up on, or "", the wait)``."""
    given_up, defer_s = "", None
    if isinstance(result, Failure) and isinstance(result.value, TaskDeferred):
        given_up, defer_s = trouble(result.value.delay_s, result.value.why)
    allowed = isinstance(result, Response) and result.status >= 400 and status_allowed(
        result.status, request, spider, settings)
    return WhatHappened(task, result, retry_times=request.meta.get("retry_times", 0),
                        status_allowed=allowed, errback=request.errback is not None,
                        output=output, given_up=given_up, defer_s=defer_s)


__all__ = ["COMMITTED", "TRANSIENT", "TROUBLE", "Outcome", "Verdict", "WhatHappened",
           "after_scrape", "fate", "final_hop", "on_delivery", "settled_now", "transient",
           "trouble_wait",
           "what_happened"]

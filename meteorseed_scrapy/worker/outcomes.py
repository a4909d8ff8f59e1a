"""How a task can end (:class:`Outcome`, :class:`Verdict`), which errors may pass, and how long a
task of a site in trouble may wait; :func:`.fate.fate` decides which end a task comes to."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from meteorseed_scrapy.politeness.breaker import Breaker
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN
from meteorseed_scrapy.store.base import StoreUnavailable
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector


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


def trouble_wait(breaker: Breaker, stats: StatsCollector, site: str, delay_s: float,
                 why: DeferReason) -> tuple[str, float]:
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


__all__ = ["COMMITTED", "TRANSIENT", "TROUBLE", "Outcome", "Verdict", "transient", "trouble_wait"]

"""worker/fate: the one decision on how a task ends, as properties over what can happen to it
(no Redis, no crawler)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.python.failure import Failure

from meteorseed_scrapy.task.exceptions import DeferReason, TaskDeferred, TaskGivenUp
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.lanes import RETRY_LANE
from meteorseed_scrapy.worker.fate import (
    REASON_MAX,
    Outcome,
    Verdict,
    WhatHappened,
    fate,
    final_hop,
    on_delivery,
    settled_now,
)

TASK = ExecTask.create(seed_id="s1", site_id="news", url="https://example.com/a")
URL = "https://example.com/a"

statuses = st.integers(min_value=100, max_value=599)
responses = statuses.map(lambda s: Response(URL, status=s))
deferrals = st.builds(
    lambda d, r, c, w: TaskDeferred(d, r, count_retry=c, why=w),
    st.floats(min_value=0, max_value=1e6), st.text(max_size=50), st.booleans(),
    st.sampled_from(DeferReason))
errors = st.one_of(
    deferrals,
    st.text(max_size=30).map(TaskGivenUp),
    st.text(max_size=30).map(IgnoreRequest),
    st.text(max_size=3000).map(ValueError),
    st.text(max_size=30).map(TimeoutError),
)
failures = errors.map(Failure)
results = st.one_of(st.none(), responses, failures)
reasons = st.text(min_size=1, max_size=3000)


@st.composite
def happenings(draw: st.DrawFn) -> WhatHappened:
    return WhatHappened(
        task=replace(TASK, retry_count=draw(st.integers(0, 20))),
        result=draw(results),
        retry_times=draw(st.integers(0, 20)),
        status_allowed=draw(st.booleans()),
        errback=draw(st.booleans()),
        output=draw(st.booleans()),
        given_up=draw(st.one_of(st.just(""), reasons)),
        defer_s=draw(st.one_of(st.none(), st.floats(min_value=0, max_value=1e6))),
        unusable=draw(st.one_of(st.just(""), reasons)),
        errors=tuple(draw(st.lists(reasons, max_size=3))),
        lasting=draw(st.booleans()),
    )


@given(happenings())
def test_every_happening_has_one_fate_with_a_bounded_reason(happened: WhatHappened) -> None:
    verdict = fate(happened)
    assert verdict == fate(happened)  # a function of the facts alone
    assert len(verdict.reason) <= REASON_MAX + len("bad task: ")
    if verdict.outcome is Outcome.DEFERRED:
        assert verdict.defer_task is not None
    if verdict.outcome is not Outcome.FAILED and happened.result is not None \
            and not happened.unusable:
        assert verdict.status == final_hop(happened).status


@given(happenings())
def test_an_unusable_task_is_dead_whatever_else_happened(happened: WhatHappened) -> None:
    if happened.unusable:
        assert fate(happened) == Verdict(Outcome.DEAD, f"bad task: {happened.unusable}")


@given(happenings())
def test_scrape_errors_never_let_a_task_be_acked(happened: WhatHappened) -> None:
    if happened.errors and not happened.unusable and happened.result is not None:
        verdict = fate(happened)
        assert verdict.outcome in (Outcome.DEAD, Outcome.FAILED)
        expected = Outcome.DEAD if happened.lasting else Outcome.FAILED
        before = fate(replace(happened, errors=()))
        if before.outcome is not Outcome.DEAD:
            assert verdict.outcome is expected
            assert verdict.reason == "; ".join(happened.errors)[:REASON_MAX]
        else:  # dead stays dead, the errors added to its reason
            assert verdict.reason.startswith(before.reason[:REASON_MAX])


@given(statuses, st.booleans(), st.integers(0, 5), st.integers(0, 5))
def test_a_response_alone(status: int, allowed: bool, retry_times: int, retries: int) -> None:
    task = replace(TASK, retry_count=retries)
    verdict = fate(WhatHappened(task, Response(URL, status=status), retry_times=retry_times,
                                status_allowed=allowed))
    if status < 400 or allowed:
        assert verdict == Verdict(Outcome.DONE, status=status)
    elif status in (404, 410):
        assert verdict == Verdict(Outcome.GONE, f"HTTP {status}", status=status)
    else:
        assert verdict == Verdict(Outcome.DEAD,
                                  f"HTTP {status} after {retry_times + retries} retries",
                                  status=status)


@given(deferrals, st.one_of(st.just(""), reasons),
       st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)), st.booleans(), st.booleans())
def test_a_deferral_waits_or_is_given_up_on(deferred: TaskDeferred, given_up: str,
                                            defer_s: float | None, errback: bool,
                                            output: bool) -> None:
    verdict = fate(WhatHappened(TASK, Failure(deferred), given_up=given_up, defer_s=defer_s,
                                errback=errback, output=output))
    if given_up:  # (an errback's output does not turn a give-up into done: it ran elsewhere)
        assert verdict == Verdict(Outcome.DEAD, given_up)
        return
    assert verdict.outcome is Outcome.DEFERRED
    assert verdict.defer_s == (deferred.delay_s if defer_s is None else defer_s)
    assert verdict.defer_why is deferred.why
    assert verdict.defer_task is not None
    assert verdict.defer_task.retry_count == TASK.retry_count + deferred.count_retry
    assert verdict.defer_lane == (RETRY_LANE if deferred.count_retry else "")


@given(st.one_of(responses.filter(lambda r: r.status >= 400 and r.status not in (404, 410)),
                 st.text(max_size=30).map(lambda m: Failure(ValueError(m))),
                 st.text(max_size=30).map(lambda m: Failure(TaskGivenUp(m)))),
       st.booleans(), st.booleans())
def test_an_errback_with_output_handles_a_final_failure(result: Response | Failure,
                                                        errback: bool, output: bool) -> None:
    dead = final_hop(WhatHappened(TASK, result))
    assert dead.outcome is Outcome.DEAD
    verdict = fate(WhatHappened(TASK, result, errback=errback, output=output))
    if errback and output:
        assert verdict == Verdict(Outcome.DONE, f"handled by the errback: {dead.reason}",
                                  status=dead.status)
    else:
        assert verdict == dead


def test_ignored_and_download_errors() -> None:
    assert fate(WhatHappened(TASK, Failure(IgnoreRequest("blacklisted")))) == Verdict(
        Outcome.IGNORED, "ignored: blacklisted")
    verdict = fate(WhatHappened(TASK, Failure(TimeoutError("slow")), retry_times=2))
    assert verdict == Verdict(Outcome.DEAD,
                              "download failed after 2 retries: TimeoutError: slow")
    assert len(fate(WhatHappened(TASK, Failure(ValueError("x" * 5000)))).reason) == REASON_MAX


def test_never_scraped() -> None:
    assert fate(WhatHappened(TASK, given_up="site sick since 12:00")) == Verdict(
        Outcome.DEAD, "site sick since 12:00")
    assert fate(WhatHappened(TASK)).outcome is Outcome.FAILED


@given(happenings(), st.integers(-2, 5))
def test_settled_now(happened: WhatHappened, children_pending: int) -> None:
    verdict = settled_now(happened, children_pending)
    # (a failed task is not acked: its children need not wait)
    if children_pending <= 0 or fate(happened).outcome is Outcome.FAILED:
        assert verdict == fate(happened)
    else:
        assert verdict is None
    assert settled_now(None, children_pending) is None


@given(st.text(max_size=50), st.integers(min_value=1, max_value=100),
       st.integers(min_value=1, max_value=100), st.booleans(), st.text(max_size=3000))
def test_a_delivery_is_judged_before_it_starts(error: str, deliveries: int, most: int,
                                              committed: bool, last: str) -> None:
    verdict = on_delivery(error, deliveries, most, committed, last)
    if error:  # not a task at all: dead, whatever else is known
        assert verdict == Verdict(Outcome.DEAD, error)
    elif committed:  # its items are in: acked without a refetch, however often delivered
        assert verdict is not None and verdict.outcome is Outcome.DONE
    elif deliveries > most:
        assert verdict is not None and verdict.outcome is Outcome.DEAD
        assert f"METEORSEED_MAX_DELIVERIES={most}" in verdict.reason
        assert len(verdict.reason) <= REASON_MAX
        assert (last or "no failure recorded")[:20] in verdict.reason
    else:
        assert verdict is None  # it starts

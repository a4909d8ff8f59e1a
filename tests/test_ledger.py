"""TaskLedger: what it counts, when a task it holds is settled (with :func:`.fate.settled_now`,
as the pump asks), and what its completion record says."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.python.failure import Failure

from meteorseed_scrapy.queue.consume.delivery import Delivery
from meteorseed_scrapy.task.context import Scrape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.fate import Outcome, Verdict, WhatHappened, settled_now
from meteorseed_scrapy.worker.ledger import Entry, TaskLedger


def make_task(url: str = "https://example.com/a") -> ExecTask:
    return ExecTask.create(seed_id="s1", site_id="news", url=url)


STREAM = "ns:tasks"


def delivery(task: ExecTask, msg_id: str, deliveries: int = 1, stream: str = STREAM
             ) -> Delivery:
    return Delivery(stream, msg_id, task.to_message(), deliveries, task)


def booked(ledger: TaskLedger, task: ExecTask, msg_id: str = "1-0") -> Entry:
    entry = ledger.add(delivery(task, msg_id))
    assert entry is not None
    return entry


def test_add_books_a_new_task() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    assert entry.task is task
    assert entry.refs == [(STREAM, "1-0")]
    assert len(ledger) == 1
    assert task.task_id in ledger
    assert ledger.get(task.task_id) is entry
    assert list(ledger.entries()) == [entry]


def test_duplicate_delivery_is_absorbed() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task, "1-0")
    assert ledger.add(delivery(task, "2-0", 2)) is None
    assert len(ledger) == 1
    assert entry.refs == [(STREAM, "1-0"), (STREAM, "2-0")]
    assert sorted(ledger.refs()) == [(STREAM, "1-0"), (STREAM, "2-0")]


def test_distinct_tasks_get_distinct_entries() -> None:
    ledger = TaskLedger()
    a, b = make_task("https://example.com/a"), make_task("https://example.com/b")
    booked(ledger, a, "1-0")
    booked(ledger, b, "2-0")
    assert len(ledger) == 2
    assert sorted(ledger.refs()) == [(STREAM, "1-0"), (STREAM, "2-0")]


OK = Response("https://example.com/a", status=200)


def finish(ledger: TaskLedger, task: ExecTask, result: Response | Failure = OK,
           **facts: object) -> Entry | None:
    """Record the final hop as the pump does; the entry, or None when not recorded."""
    return ledger.finish_scrape(task.task_id, WhatHappened(task, result, **facts))  # type: ignore[arg-type]


def due(entry: Entry) -> Verdict | None:
    """The pump's question: is ``entry`` settled now (its scrape's errors as they stand)?"""
    happened, scrape = entry.happened, entry.scrape
    if happened is not None and scrape is not None:
        happened = replace(happened, errors=tuple(scrape.errors), lasting=scrape.lasting)
    return settled_now(happened, entry.children_pending)


def test_done_without_children_settles_at_once() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    assert finish(ledger, task) is entry
    assert due(entry) == Verdict(Outcome.DONE, status=200)


def test_done_waits_for_children_to_be_durable() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    ledger.child_added(task.task_id)
    ledger.child_added(task.task_id)
    assert finish(ledger, task) is entry
    assert due(entry) is None
    assert ledger.child_durable(task.task_id) is entry
    assert due(entry) is None
    assert ledger.child_durable(task.task_id) is entry
    assert due(entry) == Verdict(Outcome.DONE, status=200)
    assert entry.children == 2 and entry.children_pending == 0


def test_children_durable_before_scrape_finishes() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    ledger.child_added(task.task_id)
    assert ledger.child_durable(task.task_id) is entry
    assert due(entry) is None  # the scrape has not finished yet
    finish(ledger, task)
    assert due(entry) is not None


@pytest.mark.parametrize(("result", "outcome"), [
    (Response("https://example.com/a", status=404), Outcome.GONE),
    (Failure(IgnoreRequest("no")), Outcome.IGNORED),
    (Response("https://example.com/a", status=500), Outcome.DEAD),
])
def test_terminal_outcomes_also_wait_for_children(result: Response | Failure,
                                                  outcome: Outcome) -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    ledger.child_added(task.task_id)
    finish(ledger, task, result)
    assert due(entry) is None
    ledger.child_durable(task.task_id)
    verdict = due(entry)
    assert verdict is not None and verdict.outcome is outcome


def scraped() -> tuple[TaskLedger, ExecTask, Entry, Scrape]:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    entry.scrape = Scrape(task)
    return ledger, task, entry, entry.scrape


def test_failed_settles_at_once_even_with_children_pending() -> None:
    ledger, task, entry, scrape = scraped()
    ledger.child_added(task.task_id)
    ledger.child_added(task.task_id)
    scrape.fail("callback raised", transient=True)
    finish(ledger, task)
    assert due(entry) == Verdict(Outcome.FAILED, "callback raised", status=200)


def test_scrape_errors_that_may_pass_turn_done_into_failed_at_once() -> None:
    ledger, task, entry, scrape = scraped()
    scrape.fail("store down", transient=True)
    scrape.fail("redis timeout", transient=True)
    ledger.child_added(task.task_id)
    finish(ledger, task)
    verdict = due(entry)  # FAILED: settled even though a child is pending
    assert verdict is not None and verdict.outcome is Outcome.FAILED
    assert verdict.reason == "store down; redis timeout"


def test_a_lasting_error_makes_the_task_dead_once_its_children_are_durable() -> None:
    ledger, task, entry, scrape = scraped()
    scrape.fail("store down", transient=True)
    scrape.fail("callback error: ValueError: bug")  # a redelivery would meet it again
    ledger.child_added(task.task_id)
    finish(ledger, task)
    assert due(entry) is None
    ledger.child_durable(task.task_id)
    verdict = due(entry)
    assert verdict is not None and verdict.outcome is Outcome.DEAD
    assert verdict.reason == "store down; callback error: ValueError: bug"


def test_a_child_refused_after_its_parent_finished_fails_the_parent() -> None:
    ledger, task, entry, scrape = scraped()
    ledger.child_added(task.task_id)
    finish(ledger, task)
    assert due(entry) is None
    scrape.fail("yielded request https://example.com/b: ValueError: poison")
    ledger.child_durable(task.task_id)
    assert due(entry) == Verdict(Outcome.DEAD, "yielded request https://example.com/b: "
                                 "ValueError: poison", status=200)


def test_scrape_errors_do_not_hide_a_dead_outcome() -> None:
    ledger, task, entry, scrape = scraped()
    scrape.fail("store down", transient=True)
    finish(ledger, task, Response("https://example.com/a", status=500), retry_times=5)
    assert due(entry) == Verdict(Outcome.DEAD, "HTTP 500 after 5 retries; store down",
                                 status=500)


def test_scrape_without_errors_stays_done() -> None:
    ledger, task, entry, scrape = scraped()
    scrape.record_commit("news:1", "{}")
    finish(ledger, task)
    assert due(entry) == Verdict(Outcome.DONE, status=200)


def test_finish_scrape_twice_or_unknown_returns_none() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    assert finish(ledger, task) is entry
    assert finish(ledger, task, Failure(ValueError("late"))) is None
    assert due(entry) == Verdict(Outcome.DONE, status=200)  # the first hop's facts stand
    assert ledger.finish_scrape("no-such-task", WhatHappened(task)) is None
    assert ledger.child_durable("no-such-task") is None
    ledger.child_added("no-such-task")  # ignored, no error


def test_pop_removes_entry() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    assert ledger.pop(task.task_id) is entry
    assert ledger.pop(task.task_id) is None
    assert len(ledger) == 0
    assert task.task_id not in ledger


def test_forget_msg_drops_unstarted_entry_with_no_delivery_left() -> None:
    ledger = TaskLedger()
    task = make_task()
    booked(ledger, task, "1-0")
    ledger.forget_msg((STREAM, "1-0"))
    assert task.task_id not in ledger
    assert ledger.refs() == []


def test_forget_msg_keeps_started_entry() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task, "1-0")
    entry.started = True
    ledger.forget_msg((STREAM, "1-0"))
    assert ledger.get(task.task_id) is entry
    assert entry.deliveries == []


def test_forget_msg_keeps_other_deliveries() -> None:
    ledger = TaskLedger()
    task, other = make_task("https://example.com/a"), make_task("https://example.com/b")
    entry = booked(ledger, task, "1-0")
    ledger.add(delivery(task, "3-0", 2))
    booked(ledger, other, "2-0")
    ledger.forget_msg((STREAM, "1-0"))
    assert entry.refs == [(STREAM, "3-0")]
    assert sorted(ledger.refs()) == [(STREAM, "2-0"), (STREAM, "3-0")]
    ledger.forget_msg((STREAM, "9-9"))  # unknown id: nothing changes
    assert len(ledger) == 2


def test_record_fields_with_scrape() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    scrape = Scrape(task)
    scrape.record_commit("news:a", '{"title":"A"}')
    scrape.record_commit("news:b", '{"title":"B"}')
    entry.scrape = scrape
    entry.verdict = Verdict(Outcome.DONE, status=200)
    before = time.time()
    record = json.loads(entry.record())
    assert set(record) == {"outcome", "items", "digest", "status", "at"}
    assert record["outcome"] == "done"
    assert record["items"] == 2
    assert record["digest"] == scrape.digest
    assert len(record["digest"]) == 64
    assert record["status"] == 200
    assert before - 1 <= record["at"] <= time.time() + 1


def test_record_digest_depends_on_committed_content() -> None:
    task = make_task()
    a, b, c = Scrape(task), Scrape(task), Scrape(task)
    a.record_commit("news:a", '{"v":1}')
    b.record_commit("news:a", '{"v":1}')
    c.record_commit("news:a", '{"v":2}')
    assert a.digest == b.digest
    assert a.digest != c.digest


def test_record_without_scrape() -> None:
    ledger = TaskLedger()
    task = make_task()
    entry = booked(ledger, task)
    entry.verdict = Verdict(Outcome.GONE, "HTTP 404", status=404)
    record = json.loads(entry.record())
    assert record["outcome"] == "gone"
    assert record["items"] == 0
    assert record["digest"] == ""
    assert record["status"] == 404

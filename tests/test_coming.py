"""A worker's own new tasks on their way through the stream (worker/waiting.py): what counts,
and that nothing is kept once read back, a duplicate, or older than COMING_MAX_S."""

from __future__ import annotations

import pytest

from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker import waiting as coming_module
from meteorseed_scrapy.worker.waiting import ComingTasks


def task(n: int, priority: int = 0) -> ExecTask:
    return ExecTask.create(seed_id="s", site_id="site", url=f"https://site.test/{n}",
                           priority=priority)


def test_the_best_priority_on_its_way_until_read_back_or_a_duplicate() -> None:
    coming = ComingTasks()
    low, high, dupe = task(1), task(2, priority=5), task(3, priority=9)
    for each in (low, high, dupe):
        coming.added(each)
    assert coming.best() == 9
    coming.written([low, high, dupe], (True, True, False))  # the duplicate is never written
    assert coming.best() == 5
    coming.arrived(high.task_id)
    assert coming.best() == 0
    coming.arrived(low.task_id)
    assert coming.best() is None


def test_tasks_taken_elsewhere_expire_and_are_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(coming_module.time, "monotonic", lambda: now[0])
    coming = ComingTasks()
    for n in range(100):  # another worker reads them: none arrives here
        coming.added(task(n, priority=3))
    now[0] += coming_module.COMING_MAX_S + 0.1
    coming.added(task(100))
    assert len(coming) == 1  # the old ones went when a new one came, best() never asked
    assert coming.best() == 0

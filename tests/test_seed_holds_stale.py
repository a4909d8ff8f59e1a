"""A held seed's task parked on a stale read of the holds (the worker's loop was blocked across
a resume) comes back within seconds, not after the hour a fresh read parks it for."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from meteorseed_scrapy.queue.consume.delayed_set import STALE_PARK_S, STALE_VIEW_S
from meteorseed_scrapy.queue.consume.seed_control import PARK_S
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.ledger import Entry
from meteorseed_scrapy.worker.seed_holds import SeedHolds


class _Recorder:
    """Stands for the consumer, ledger, buffer, completions and stats: records what is asked."""

    def __init__(self) -> None:
        self.redis = self
        self.parks: list[tuple[str, float, DeferReason]] = []

    def register_script(self, source: str) -> None:
        return None

    def pop(self, task_id: str) -> None:
        return None

    def parked(self, entry: Entry, delay_s: float, why: DeferReason) -> None:
        self.parks.append((entry.task.task_id, delay_s, why))

    def inc_value(self, key: str, count: int = 1) -> None:
        return None


def _holds(recorder: _Recorder) -> SeedHolds:
    any_: Any = recorder
    holds = SeedHolds(any_, any_, any_, any_, any_, on_gone=lambda task_id: None)
    holds.held = frozenset({"s1"})
    return holds


def _entry(n: int) -> Entry:
    task = ExecTask.create(seed_id="s1", site_id="news", url=f"https://news.example/{n}")
    return Entry(task=task, deliveries=[])


def test_a_fresh_read_parks_a_held_seeds_task_for_the_hour() -> None:
    recorder = _Recorder()
    holds = _holds(recorder)
    holds.read_at = time.monotonic()
    assert holds.stops(_entry(1))
    assert [(d, why) for _, d, why in recorder.parks] == [(PARK_S, DeferReason.PAUSED)]


def test_a_stale_read_parks_it_only_until_the_next_look() -> None:
    recorder = _Recorder()
    holds = _holds(recorder)
    holds.read_at = time.monotonic() - STALE_VIEW_S - 2.0  # a loop blocked across a resume
    assert holds.stops(_entry(2))
    assert [(d, why) for _, d, why in recorder.parks] == [(STALE_PARK_S, DeferReason.PAUSED)]
    assert STALE_PARK_S < PARK_S


def test_a_seed_not_held_is_not_stopped() -> None:
    recorder = _Recorder()
    holds = _holds(recorder)
    holds.held = frozenset()
    assert not holds.stops(_entry(3)) and recorder.parks == []


class _SlowPipeline:
    """A pipeline whose reply is read only after the worker's loop was blocked for a while:
    the clock moves on between the asking and the answer."""

    def __init__(self, clock: list[float], blocked_s: float) -> None:
        self.clock, self.blocked_s = clock, blocked_s

    async def __aenter__(self) -> _SlowPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def hkeys(self, key: str) -> None:
        return None

    def zrangebyscore(self, key: str, low: str, high: str) -> None:
        return None

    async def execute(self) -> list[list[bytes]]:
        self.clock[0] += self.blocked_s
        return [[b"s1"], []]


def test_the_view_is_as_old_as_its_asking_not_its_answer(monkeypatch: Any) -> None:
    """A reply that waited while the loop was blocked (a resume may have run meanwhile) is a
    stale view: the held seed's task parks only briefly."""
    from meteorseed_scrapy.queue.keys import KeyLayout
    from meteorseed_scrapy.worker import seed_holds

    clock = [1000.0]
    monkeypatch.setattr(seed_holds.time, "monotonic", lambda: clock[0])
    recorder = _Recorder()
    holds = _holds(recorder)
    recorder.keys = KeyLayout("stale")  # type: ignore[attr-defined]
    slow = _SlowPipeline(clock, STALE_VIEW_S + 2.0)
    recorder.pipeline = lambda transaction: slow  # type: ignore[attr-defined]
    asyncio.run(holds.refresh())
    assert holds.held == frozenset({"s1"})
    assert holds.stops(_entry(4))
    assert [(d, why) for _, d, why in recorder.parks] == [(STALE_PARK_S, DeferReason.PAUSED)]

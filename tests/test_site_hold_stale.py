"""A worker parks a held site's waiting tasks for the hold's hour on its view of the hold: if a
resume ended its passes before that parking reached Redis, nothing would wake them. A view
over STALE_VIEW_S old parks them for STALE_PARK_S only, and a resume's passes span the time a
fresh view's parking takes to land (real Redis, a real gate and dispatcher; the worker's clock
injected, the resume run where the worker's loop was blocked)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector

from meteorseed_scrapy.politeness import control, permits
from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.politeness.control import HOLD_RECHECK_S, SiteRef
from meteorseed_scrapy.politeness.gate import Grant, SiteGate
from meteorseed_scrapy.politeness.permits import PermitDesk, SiteQueues
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.consume import delayed_set
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import STALE_PARK_S, STALE_VIEW_S, DelayedSet
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.delayed import due_at, reason_of
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.worker.dispatcher import Dispatcher
from meteorseed_scrapy.worker.ledger import Entry
from meteorseed_scrapy.worker.waiting import WaitingTasks

LIMITS = SiteLimits(rate=1000.0, burst=1000, concurrency=100)
Meanwhile = Callable[[], Awaitable[None]]


class Clock:
    """The worker's monotonic clock (the permit desk's), moved by the test."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


class BlockedAfterReply(SiteGate):
    """A gate whose caller does not get the reply at once: ``meanwhile`` runs first (its loop
    was blocked, Redis slow)."""

    meanwhile: Meanwhile | None = None

    async def acquire(self, site: str, wanted: int) -> Grant:
        grant = await super().acquire(site, wanted)
        if self.meanwhile is not None:
            await self.meanwhile()
        return grant


def worker_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(permits, "time", SimpleNamespace(monotonic=clock))
    return clock


async def held_tasks(client: Any, keys: KeyLayout, n: int) -> list[Entry]:
    """``n`` tasks of ``news`` read from their stream, as the worker holds them."""
    await TaskWriter(client, keys).add([
        ExecTask.create(seed_id="s", site_id="news", url=f"https://news.test/{i}")
        for i in range(n)])
    consumer = StreamConsumer(client, keys, "w1")
    await consumer.ensure_group()
    entries = []
    for d in await consumer.read(n, 0):
        assert d.task is not None
        entries.append(Entry(task=d.task, deliveries=[d]))
    return entries


async def park_once(client: Any, keys: KeyLayout, entries: list[Entry], gate: SiteGate
                    ) -> tuple[PermitDesk, list[tuple[float, DeferReason]]]:
    """One step of the worker's dispatcher over ``entries``; what it parks is written to the
    delayed set, as its flush loop does."""
    stats = MemoryStatsCollector(SimpleNamespace(settings=Settings()))
    desk = PermitDesk(gate, stats)
    buffer = WaitingTasks(lambda _e: False)
    for entry in entries:
        buffer.append("news", entry)
    parked: list[tuple[Entry, float, DeferReason]] = []
    dispatcher = Dispatcher(
        desk, buffer, SiteQueues(), lambda _s: LIMITS,
        Breaker(client, keys, BreakerConfig(), stats), budget=lambda: 10,
        on_change=lambda: None, park=lambda e, d, why: parked.append((e, d, why)), stats=stats)
    await dispatcher.step()
    delayed = DelayedSet(client, keys)
    for entry, delay, why in parked:
        assert await delayed.defer(entry.deliveries[0].ref, entry.task, delay, "", why)
    return desk, [(delay, why) for _e, delay, why in parked]


def due_in(sync_redis: redis.Redis, keys: KeyLayout) -> list[tuple[float, str]]:
    """Each delayed task's (seconds until due, reason), by Redis time."""
    seconds, micros = sync_redis.time()
    now = seconds + micros / 1e6
    members = sync_redis.zrange(keys.delayed, 0, -1, withscores=True)
    return sorted((due_at(score) - now, reason_of(score))  # type: ignore[operator]
                  for _member, score in members)


def test_a_park_on_a_hold_seen_before_a_resume_it_missed_is_due_in_seconds(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    keys, clock = KeyLayout(namespace), worker_clock(monkeypatch)
    assert control.hold(sync_redis, keys, SiteRef("news"), "ops")
    woken: list[int | None] = []

    async def resumed_while_blocked() -> None:
        # The whole resume (every pass) runs before the worker parks on its old view.
        woken.append(await asyncio.to_thread(control.release, sync_redis, keys,
                                             SiteRef("news"), "ops"))
        clock.now += STALE_VIEW_S + 1.0

    async def scenario(client: Any) -> tuple[list[tuple[float, DeferReason]], float, int]:
        entries = await held_tasks(client, keys, 3)
        gate = BlockedAfterReply(client, keys, lambda _s: LIMITS, "c1", Backoff(1.0, 300.0))
        gate.meanwhile = resumed_while_blocked
        desk, parks = await park_once(client, keys, entries, gate)
        asks_in = desk.retry_at["news"] - clock.now
        gate.meanwhile = None
        clock.now = desk.retry_at["news"]  # the desk asks the gate again: the site is resumed
        await desk.refill({"news": 1}, 10)
        return parks, asks_in, desk.held("news")

    parks, asks_in, granted = run(redis_url, scenario)
    assert woken == [0]  # nothing was parked yet when the resume passed
    assert [why for _d, why in parks] == [DeferReason.PAUSED] * 3
    assert all(delay <= STALE_PARK_S + 0.01 for delay, _why in parks), parks
    assert 0 < asks_in <= STALE_PARK_S and granted == 1
    waits = due_in(sync_redis, keys)
    assert len(waits) == 3 and all(w <= STALE_PARK_S + 1 for w, _r in waits), waits
    assert {r for _w, r in waits} == {"paused"}


def test_a_fresh_view_of_a_hold_parks_the_tasks_for_the_hold(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    keys, clock = KeyLayout(namespace), worker_clock(monkeypatch)
    control.hold(sync_redis, keys, SiteRef("news"), "ops")

    async def scenario(client: Any) -> tuple[list[tuple[float, DeferReason]], float]:
        entries = await held_tasks(client, keys, 2)
        gate = SiteGate(client, keys, lambda _s: LIMITS, "c1", Backoff(1.0, 300.0))
        desk, parks = await park_once(client, keys, entries, gate)
        return parks, desk.retry_at["news"] - clock.now

    parks, asks_in = run(redis_url, scenario)
    assert [(round(d), why) for d, why in parks] == [(HOLD_RECHECK_S, DeferReason.PAUSED)] * 2
    assert 0 < asks_in <= STALE_PARK_S  # it asks again soon all the same
    assert all(w > HOLD_RECHECK_S - 60 for w, _r in due_in(sync_redis, keys))


def test_a_park_on_a_fresh_view_landing_after_two_passes_is_woken_by_a_later_one(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A view under STALE_VIEW_S old parks for the hour: the resume's passes must still be
    running when such a parking reaches Redis (they were two, back to back)."""
    keys = KeyLayout(namespace)
    worker_clock(monkeypatch)  # (frozen: the worker's view stays fresh)
    control.hold(sync_redis, keys, SiteRef("news"), "ops")
    passes, two_passes, written = [0], threading.Event(), threading.Event()
    make_due = delayed_set.make_due

    def counted(*args: Any) -> int:
        n = make_due(*args)
        passes[0] += 1
        if passes[0] == 2:
            two_passes.set()
            written.wait(30)  # the worker's parking lands now
        return n

    monkeypatch.setattr(delayed_set, "make_due", counted)
    resume: list[asyncio.Future[int | None]] = []

    async def resumed_meanwhile() -> None:
        resume.append(asyncio.ensure_future(asyncio.to_thread(
            control.release, sync_redis, keys, SiteRef("news"), "ops")))
        assert await asyncio.to_thread(two_passes.wait, 30)

    async def scenario(client: Any) -> tuple[list[tuple[float, DeferReason]], int | None]:
        entries = await held_tasks(client, keys, 3)
        gate = BlockedAfterReply(client, keys, lambda _s: LIMITS, "c1", Backoff(1.0, 300.0))
        gate.meanwhile = resumed_meanwhile
        try:
            _desk, parks = await park_once(client, keys, entries, gate)
        finally:
            written.set()
        return parks, await resume[0]

    parks, woken = run(redis_url, scenario)
    assert [(round(d), why) for d, why in parks] == [(HOLD_RECHECK_S, DeferReason.PAUSED)] * 3
    assert woken == 3 and passes[0] > 2
    waits = due_in(sync_redis, keys)
    assert len(waits) == 3 and all(w <= 1 for w, _r in waits), waits


def test_an_old_view_of_a_429_pause_still_parks_for_the_pause(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pause ends at a known time, whoever resumes nothing: only a hold's park is cut."""
    keys, clock = KeyLayout(namespace), worker_clock(monkeypatch)

    async def aged() -> None:
        clock.now += STALE_VIEW_S + 1.0

    async def scenario(client: Any) -> list[tuple[float, DeferReason]]:
        entries = await held_tasks(client, keys, 2)
        other = SiteGate(client, keys, lambda _s: LIMITS, "c2", Backoff(1.0, 300.0))
        await other.pause("news", 60.0)  # another worker's 429, Retry-After 60 s
        gate = BlockedAfterReply(client, keys, lambda _s: LIMITS, "c1", Backoff(1.0, 300.0))
        gate.meanwhile = aged
        return (await park_once(client, keys, entries, gate))[1]

    parks = run(redis_url, scenario)
    # (the pause: Retry-After and a jitter, less the moment since)
    assert len(parks) == 2 and all(55 < d < 120 and why is DeferReason.PAUSED
                                   for d, why in parks), parks

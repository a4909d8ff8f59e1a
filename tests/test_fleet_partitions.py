"""A fleet on simulated hosts (network namespaces): partitions of a worker, of Redis, of a site.

Each worker is a real ``scrapy crawl`` in its own namespace; Redis and the site are on hosts of
their own (meteorseed_scrapy.testing.netns). Skipped where namespaces cannot be made.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.netns import Fleet, unavailable
from meteorseed_scrapy.testing.polling import wait_for
from tests.e2e_helpers import PROJECT, REPO, Worker, enqueue, stored_docs
from tests.subprocess_env import python_path

_WHY = unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(_WHY is not None, reason=_WHY or "")]

NS = "fleet"
CLAIM_IDLE = 3


def start_worker(fleet: Fleet, host: str, redis_url: str, store: Path,
                 **settings: Any) -> Worker:
    """``scrapy crawl probe`` (tests/e2e_project) inside ``host``'s namespace."""
    log_path = fleet.workdir / f"{host}.log"
    stats_path = fleet.workdir / f"{host}.stats.json"
    base: dict[str, Any] = {
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": NS,
        "METEORSEED_STORE_URI": f"sqlite:///{store}", "METEORSEED_CONSUMER": host,
        "METEORSEED_CLAIM_IDLE": CLAIM_IDLE, "METEORSEED_IDLE_CLOSE": 4,
        "LOG_FILE": str(log_path), "PROBE_STATS_FILE": str(stats_path),
    }
    base.update(settings)
    argv = [sys.executable, "-m", "scrapy.cmdline", "crawl", "probe"]
    for key, value in base.items():
        argv += ["-s", f"{key}={value}"]
    env = dict(os.environ, PYTHONPATH=python_path(REPO, PROJECT))
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    proc = fleet.spawn(host, argv, env=env, cwd=PROJECT)
    return Worker(host, proc, log_path, stats_path)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    with Fleet(workers=2) as built:
        yield built


def _pending(r: redis.Redis, keys: KeyLayout) -> dict[str, int]:
    summary = r.xpending(keys.stream, keys.group)
    return {c["name"]: int(c["pending"]) for c in summary["consumers"]}


def _outage_lines(worker: Worker) -> tuple[int, int]:
    log = worker.log()
    return log.count("Redis unavailable"), log.count("Redis is back")


def _check_all_done(r: redis.Redis, keys: KeyLayout, store: Path, task_ids: set[str]
                    ) -> dict[str, int]:
    docs = stored_docs(store)
    stored = [d["task_id"] for d in docs.values()]
    figures = {"lost": len(task_ids - set(stored)), "duplicates": len(stored) - len(set(stored)),
               "pending": int(r.xpending(keys.stream, keys.group)["pending"]),
               "dead": int(r.xlen(keys.dead))}
    assert figures == {"lost": 0, "duplicates": 0, "pending": 0, "dead": 0}, figures
    assert set(stored) == task_ids
    assert r.xlen(keys.stream) == 0
    return figures


class PendingWatch:
    """Samples a consumer's pending count from a thread: when it first took a task and first
    completed one (its pending count fell) after :meth:`start`."""

    def __init__(self, redis_url: str, keys: KeyLayout, consumer: str) -> None:
        self.r = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
        self.keys, self.consumer = keys, consumer
        self.took: float | None = None
        self.completed: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PendingWatch:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        last = None
        while not self._stop.wait(0.02):
            try:
                now = _pending(self.r, self.keys).get(self.consumer, 0)
            except redis.RedisError:
                continue
            if last is not None and now > last and self.took is None:
                self.took = time.monotonic() - self.t0
            if last is not None and now < last and self.completed is None:
                self.completed = time.monotonic() - self.t0
            last = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.r.close()


@pytest.mark.parametrize("longer", [True, False], ids=["longer-than-claim-idle", "shorter"])
def test_a_worker_cut_off_from_redis_loses_and_duplicates_nothing(
        fleet: Fleet, longer: bool) -> None:
    redis_url, site = fleet.start_redis(), fleet.start_site()
    keys, store = KeyLayout(NS), fleet.workdir / "items.db"
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    tasks = enqueue(redis_url, NS, [f"{site}/slow/800?i={i}" for i in range(300)])
    cut_off = start_worker(fleet, "w1", redis_url, store, CONCURRENT_REQUESTS=4)
    # The other worker slower: work is left when w1 is back, whose backoff may reach 30 s.
    other = start_worker(fleet, "w2", redis_url, store, CONCURRENT_REQUESTS=2)
    wait_for(lambda: len(stored_docs(store)) >= 4, 60)
    wait_for(lambda: _pending(r, keys).get("w1", 0) > 0, 30, 0.01)
    fleet.cut("w1", "back")  # from Redis only: w1 still reaches the site and ends its pages
    cut_at = time.monotonic()
    held = _pending(r, keys).get("w1", 0)
    if longer:  # until the other worker has reclaimed some of what w1 held
        wait_for(lambda: _pending(r, keys).get("w1", 0) < held, 90, 0.05)
        wait_for(lambda: "Redis unavailable" in cut_off.log(), 60)  # and w1 has noticed
    else:  # well inside the liveness TTL (CLAIM_IDLE / 2 from w1's last heartbeat): a cut of
        # CLAIM_IDLE / 3 left too little margin on a loaded machine, where healing is slow
        wait_for(lambda: time.monotonic() - cut_at >= CLAIM_IDLE / 6, CLAIM_IDLE)
    fleet.heal("w1", "back")
    watch = PendingWatch(redis_url, keys, "w1").start()
    cut_s = time.monotonic() - cut_at
    try:
        assert other.wait(180) == 0, other.log()[-3000:]
        assert cut_off.wait(180) == 0, cut_off.log()[-3000:]
    finally:
        watch.stop()
    figures = _check_all_done(r, keys, store, {t.task_id for t in tasks})
    reclaimed = other.stats().get("meteorseed/reclaimed", 0)
    assert cut_off.stats().get("meteorseed/acked", 0) > 0
    unavailable, back = _outage_lines(cut_off)
    assert unavailable == back, "every outage the worker logs ends with it back"
    if longer:
        assert unavailable >= 1
        assert reclaimed > 0
        assert watch.took is not None, "after healing, the cut-off worker takes work again"
    else:
        assert reclaimed == 0, "a partition shorter than CLAIM_IDLE reclaims nothing"
    assert watch.completed is not None
    print(f"partition {cut_s:.1f}s (CLAIM_IDLE {CLAIM_IDLE}s); w1 held {held}, w2 {reclaimed} "
          f"reclaimed; heal -> next task taken {watch.took}s, next completion "
          f"{watch.completed:.2f}s; {figures}")


def test_redis_cut_off_from_every_worker_pauses_them_and_they_resume(fleet: Fleet) -> None:
    redis_url, site = fleet.start_redis(), fleet.start_site()
    keys, store = KeyLayout(NS), fleet.workdir / "items.db"
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    tasks = enqueue(redis_url, NS, [f"{site}/slow/800?i={i}" for i in range(120)])
    workers = [start_worker(fleet, w, redis_url, store, CONCURRENT_REQUESTS=4)
               for w in ("w1", "w2")]
    wait_for(lambda: len(stored_docs(store)) >= 8, 60)
    wait_for(lambda: min(_pending(r, keys).get(w, 0) for w in ("w1", "w2")) > 0, 30, 0.01)
    fleet.cut("redis")
    cut_at = time.monotonic()
    stored_at_cut = len(stored_docs(store))
    # In-flight pages end and are stored while Redis is away (their acks wait).
    wait_for(lambda: len(stored_docs(store)) > stored_at_cut, 30)
    wait_for(lambda: all("Redis unavailable" in w.log() for w in workers), 30)
    wait_for(lambda: time.monotonic() - cut_at >= 12, 20)  # the outage under test: 12 s
    assert all(w.proc.poll() is None for w in workers), "no worker may exit while Redis is away"
    fleet.heal("redis")
    watch = PendingWatch(redis_url, keys, "w1").start()
    cut_s = time.monotonic() - cut_at
    try:
        for w in workers:
            assert w.wait(180) == 0, w.log()[-3000:]
    finally:
        watch.stop()
    figures = _check_all_done(r, keys, store, {t.task_id for t in tasks})
    assert [_outage_lines(w) for w in workers] == [(1, 1), (1, 1)]
    assert watch.completed is not None
    print(f"Redis cut off {cut_s:.1f}s; heal -> w1's next completion {watch.completed:.2f}s; "
          f"{figures}")


def test_a_site_unreachable_from_one_host_only_keeps_the_fleet_breaker_closed(
        fleet: Fleet) -> None:
    redis_url, site = fleet.start_redis(), fleet.start_site()
    keys, store = KeyLayout(NS), fleet.workdir / "items.db"
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    fleet.cut("w1", "front")  # w1 reaches Redis, not the site; w2 reaches both
    tasks = enqueue(redis_url, NS, [f"{site}/slow/100?i={i}" for i in range(400)])
    settings = {"CONCURRENT_REQUESTS": 4, "DOWNLOAD_TIMEOUT": 2,
                "METEORSEED_BREAKER_MIN_REQUESTS": 8, "METEORSEED_BREAKER_WINDOW": 30}
    # The fleet's window must hold w2's healthy traffic before w1's failures reach it: a window
    # holding only w1's timeouts is, rightly, a site down for the whole fleet.
    other = start_worker(fleet, "w2", redis_url, store, **settings)
    wait_for(lambda: len(stored_docs(store)) >= 8, 60)
    cut_off = start_worker(fleet, "w1", redis_url, store, **settings)
    assert other.wait(180) == 0, other.log()[-3000:]
    assert cut_off.wait(180) == 0, cut_off.log()[-3000:]
    figures = _check_all_done(r, keys, store, {t.task_id for t in tasks})
    a, b = cut_off.stats(), other.stats()
    # w1's own window judged the site down: its failures went back without using retries...
    assert a.get("meteorseed/outcome/done", 0) == 0
    assert a.get("meteorseed/deferred", 0) > 0
    # ...while the fleet's breaker stayed closed and w2 crawled everything.
    assert not [k for k in (*a, *b) if k.startswith("meteorseed/breaker/") and k.endswith("/open")]
    assert b.get("meteorseed/outcome/done", 0) == len(tasks)
    print(f"w1 (no route to the site): {a.get('meteorseed/deferred')} deferred; w2 done "
          f"{b.get('meteorseed/outcome/done')}; {figures}")

"""Chaos: a worker killed with SIGKILL, Redis going away, the store locked."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import RedisServer
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker, stored_docs

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


def _pending_by_consumer(r: redis.Redis, keys: KeyLayout) -> dict[str, int]:
    summary = r.xpending(keys.stream, keys.group)
    return {c["name"]: int(c["pending"]) for c in summary["consumers"]}


def test_sigkill_of_one_worker_loses_nothing(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    urls = [f"{demo_site.url}/slow/200?i={i}" for i in range(80)]
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    tasks = enqueue(redis_url, namespace, urls)
    settings = {"METEORSEED_CLAIM_IDLE": 2, "CONCURRENT_REQUESTS": 8, "METEORSEED_IDLE_CLOSE": 3}
    victim = start_worker(tmp_path, redis_url, namespace, name="victim", **settings)
    other = start_worker(tmp_path, redis_url, namespace, name="other", **settings)
    # Kill the victim while it holds tasks in flight and has already committed some.
    wait_for(lambda: len(stored_docs(tmp_path / "items.db")) >= 10, 60)
    wait_for(lambda: _pending_by_consumer(sync_redis, keys).get("victim", 0) > 0, 30, 0.01)
    victim.kill()
    killed_at = time.monotonic()
    # Counted once it is dead: until then, acks it had in flight still land.
    held = _pending_by_consumer(sync_redis, keys).get("victim", 0)
    late = start_worker(tmp_path, redis_url, namespace, name="late", **settings)
    wait_for(lambda: _pending_by_consumer(sync_redis, keys).get("victim", 0) == 0, 60, 0.05)
    taken_over_s = time.monotonic() - killed_at
    assert other.wait(120) == 0, other.log()[-3000:]
    assert late.wait(120) == 0, late.log()[-3000:]

    docs = stored_docs(tmp_path / "items.db")
    assert len(docs) == len(tasks), "every task's item is stored exactly once"
    assert {d["task_id"] for d in docs.values()} == {t.task_id for t in tasks}
    assert sync_redis.xlen(keys.stream) == 0
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 0
    assert sync_redis.xlen(keys.dead) == 0
    reclaimed = sum(w.stats().get("meteorseed/reclaimed", 0) for w in (other, late))
    assert reclaimed >= held > 0
    print(f"victim held {held} tasks; taken over {taken_over_s:.1f}s after SIGKILL")


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(appendonly=True, workdir=str(tmp_path / "redis"))
    Path(server.workdir).mkdir()
    server.start()
    try:
        yield server
    finally:
        server.close()


def test_redis_outage_pauses_the_worker_and_it_resumes_by_itself(
    tmp_path: Path, aof_redis: RedisServer, demo_site: DemoSite, namespace: str
) -> None:
    ns = namespace  # (on its own server: the fixture's clean-up there finds nothing)
    keys = KeyLayout(ns)
    urls = [f"{demo_site.url}/slow/300?o={i}" for i in range(40)]
    tasks = enqueue(aof_redis.url, ns, urls)
    worker = start_worker(tmp_path, aof_redis.url, ns, CONCURRENT_REQUESTS=4,
                          METEORSEED_CLAIM_IDLE=5, METEORSEED_IDLE_CLOSE=2)
    wait_for(lambda: len(stored_docs(tmp_path / "items.db")) >= 4, 60)
    aof_redis.stop()
    wait_for(lambda: "Redis unavailable" in worker.log(), 60, 0.05)
    # The outage itself: longer than METEORSEED_IDLE_CLOSE, which must not end the worker.
    time.sleep(3)
    assert worker.proc.poll() is None, "the worker must not crash while Redis is away"
    aof_redis.start()
    assert worker.wait(120) == 0, worker.log()[-3000:]
    log = worker.log()
    assert "Redis unavailable" in log and "Redis is back" in log
    docs = stored_docs(tmp_path / "items.db")
    assert len(docs) == len(tasks)
    r = redis.Redis.from_url(aof_redis.url, decode_responses=True)
    try:
        assert r.xlen(keys.stream) == 0
        assert r.xlen(keys.dead) == 0
    finally:
        r.close()


def test_store_outage_acks_nothing_until_items_are_committed(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    store = tmp_path / "items.db"
    with sqlite3.connect(store) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS items (_id TEXT PRIMARY KEY, doc TEXT NOT NULL)")
    urls = [f"{demo_site.url}/shop/product/{i}" for i in range(1, 11)]
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    enqueue(redis_url, namespace, urls)
    lock = sqlite3.connect(store, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_STORE_RETRY_MAX=60)
        wait_for(lambda: sync_redis.xpending(keys.stream, keys.group)["pending"] == 10, 60)
        # Items reached the store and their write failed (after SQLite's own lock waits): an
        # ack not waiting for the commit would have happened by now.
        wait_for(lambda: "Store unavailable (attempt 1," in worker.log(), 90, 0.05)
        assert sync_redis.xlen(keys.stream) == 10, "nothing may be acked while the store is down"
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert worker.wait(120) == 0, worker.log()[-3000:]
    assert len(stored_docs(store)) == 10
    assert sync_redis.xlen(keys.stream) == 0
    assert sync_redis.xlen(keys.dead) == 0


def test_a_vanished_stream_and_group_are_created_again(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    enqueue(redis_url, namespace, [f"{demo_site.url}/shop/product/{i}" for i in range(1, 6)])
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_IDLE_CLOSE=0)
    wait_for(lambda: len(stored_docs(tmp_path / "items.db")) == 5, 60)
    wait_for(lambda: sync_redis.xlen(keys.stream) == 0, 30)
    sync_redis.delete(keys.stream)  # e.g. a Redis restarted without persistence
    # New tasks once the worker has seen the group gone and made it again (mkstream).
    wait_for(lambda: "is gone" in worker.log() and sync_redis.exists(keys.stream), 60, 0.05)
    enqueue(redis_url, namespace, [f"{demo_site.url}/shop/product/{i}" for i in range(6, 11)])
    wait_for(lambda: len(stored_docs(tmp_path / "items.db")) == 10, 60)
    worker.signal(signal.SIGINT)
    assert worker.wait(60) == 0
    assert "is gone" in worker.log()
    assert sync_redis.xlen(keys.stream) == 0

"""A worker whose store is gone stops with exit code 1, acking nothing and dead-lettering
nothing (issue 22.3): real `scrapy crawl` workers, a real Redis, real SQLite files on a real
full disk (a small tmpfs; skipped where this process may not mount one) or deleted mid-crawl."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker, stored_docs
from tests.test_store_outages import fill, mounted_tmpfs

STOP_LINE = "stopping this worker"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk") as disk:
        yield disk


def test_a_full_disk_stops_the_worker_with_nothing_acked_or_dead_lettered(
    tmp_path: Path, small_disk: Path, redis_url: str, namespace: str,
    sync_redis: redis.Redis, demo_site: DemoSite,
) -> None:
    keys = KeyLayout(namespace)
    store = small_disk / "items.db"
    with sqlite3.connect(store) as conn:  # the store as a worker left it; then the disk fills
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE items (_id TEXT PRIMARY KEY, doc TEXT NOT NULL)")
    fill(small_disk)
    enqueue(redis_url, namespace, [f"{demo_site.url}/shop/product/{i}" for i in range(1, 41)])
    worker = start_worker(tmp_path, redis_url, namespace, store=store,
                          METEORSEED_STORE_RETRY_MAX=1, METEORSEED_CLAIM_IDLE=1,
                          METEORSEED_MAX_DELIVERIES=1)
    assert worker.wait(120) == 1, worker.log()[-3000:]
    log = worker.log()
    assert log.count(STOP_LINE) == 1, log[-3000:]
    assert "one by one" not in log and "Store refused document" not in log
    # The store stage says it in two lines: a warning when it starts, the error at the stop.
    assert log.count("[meteorseed_scrapy.store.group_commit] WARNING") == 1, log[-3000:]
    assert "[meteorseed_scrapy.store.group_commit] ERROR" not in log
    assert worker.stats()["meteorseed/store/outage_stop"] == 1
    assert worker.stats()["finish_reason"] == "meteorseed_store_unavailable"
    assert sync_redis.xlen(keys.stream) == 40  # nothing acked
    assert sync_redis.xlen(keys.dead) == 0  # nothing dead-lettered
    assert stored_docs(store) == {}


def test_a_store_file_deleted_mid_crawl_stops_the_worker_and_acks_nothing_more(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite,
) -> None:
    keys = KeyLayout(namespace)
    store = tmp_path / "items.db"
    enqueue(redis_url, namespace, [f"{demo_site.url}/shop/product/{i}" for i in range(1, 6)])
    worker = start_worker(tmp_path, redis_url, namespace, store=store, METEORSEED_IDLE_CLOSE=0)
    wait_for(lambda: len(stored_docs(store)) == 5 and sync_redis.xlen(keys.stream) == 0, 60)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store}{suffix}").unlink(missing_ok=True)
    enqueue(redis_url, namespace, [f"{demo_site.url}/shop/product/{i}" for i in range(6, 11)])
    assert worker.wait(120) == 1, worker.log()[-3000:]
    log = worker.log()
    assert log.count(STOP_LINE) == 1 and "was deleted" in log, log[-3000:]
    assert worker.stats()["finish_reason"] == "meteorseed_store_unavailable"
    assert sync_redis.xlen(keys.stream) == 5  # the five tasks after the deletion: not acked
    assert sync_redis.xlen(keys.dead) == 0
    assert not store.exists()  # no empty file quietly put in its place

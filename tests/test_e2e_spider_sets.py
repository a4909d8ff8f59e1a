"""Tasks belong to a spider (issue 26 point 5), with real `scrapy crawl` workers: two spiders of
one project crawl one site side by side on one namespace, each storing only its own items
(children included) and nothing lost; without spider names they share the default set, and
a worker says so once; ``meteorseed status`` shows the backlog per spider."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from redis.crc import key_slot

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.testing.cluster import LocalCluster
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import add_tasks, start_worker, stored_docs
from tests.test_cluster_shards import enqueue

pytestmark = pytest.mark.e2e

SHARED_WARNING = "takes tasks that name no spider, and so do live workers of spider"


def seed_tasks(site: DemoSite, spider: str | None, paths: list[str], *, site_id: str = "demo"
               ) -> list[ExecTask]:
    seed = SeedTask(seed_id=f"seed-{spider}", site_id=site_id, task_type="url_list",
                    payload={"urls": [site.url + p for p in paths]}, spider=spider)
    return [seed.exec_task(site.url + p) for p in paths]


def status_json(redis_url: str, namespace: str) -> dict[str, Any]:
    out = io.StringIO()
    assert main(["status", "--redis-url", redis_url, "--namespace", namespace, "--json"],
                stdout=out, stderr=io.StringIO()) == 0
    return cast(dict[str, Any], json.loads(out.getvalue()))


def test_two_spiders_side_by_side_each_store_only_their_own(
        tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite) -> None:
    news = seed_tasks(demo_site, "pair_news", ["/news/list/1", "/news/list/2"])
    shop = seed_tasks(demo_site, "pair_shop", ["/shop/category/1", "/shop/category/2"])
    add_tasks(redis_url, namespace, [*news, *shop])

    # Before any worker: the backlog per spider, and nobody runs either.
    status = status_json(redis_url, namespace)
    rows = {row["spider"]: row for row in status["spiders"]}
    assert rows["pair_news"]["backlog"] == 2 and rows["pair_shop"]["backlog"] == 2
    assert rows[None]["backlog"] == 0
    assert rows["pair_news"]["unserved"] and rows["pair_shop"]["unserved"]
    assert status["backlog"] == 4

    store = tmp_path / "items.db"
    workers = [start_worker(tmp_path, redis_url, namespace, name=spider, store=store,
                            spider=spider)
               for spider in ("pair_news", "pair_shop")]
    for worker in workers:
        assert worker.wait(180) == 0, worker.log()[-3000:]

    docs = stored_docs(store)
    by_spider: dict[str, set[str]] = {}
    for doc in docs.values():
        by_spider.setdefault(doc["parsed_by"], set()).add(doc["url"].split(demo_site.url)[1])
    # Listing pages and every child of theirs, each by its own spider, nothing lost.
    assert by_spider["pair_news"] == {"/news/list/1", "/news/list/2",
                                      *(f"/news/article/{i}" for i in range(1, 21))}
    assert by_spider["pair_shop"] == {"/shop/category/1", "/shop/category/2",
                                      *(f"/shop/product/{i}" for i in range(1, 21))}
    assert set(by_spider) == {"pair_news", "pair_shop"}
    for worker in workers:
        assert SHARED_WARNING not in worker.log()
    client = redis.Redis.from_url(redis_url)
    keys = KeyLayout(namespace).with_spiders(["pair_news", "pair_shop"])
    assert all(client.xlen(s) == 0 for s in keys.streams)
    assert {m.decode() for m in client.smembers(keys.spiders_key)} == {"pair_news",
                                                                      "pair_shop"}


def test_a_spider_no_worker_runs_waits_and_status_says_so(
        tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite) -> None:
    """A worker of another spider never takes them (it ends idle), and they are still there."""
    add_tasks(redis_url, namespace, seed_tasks(demo_site, "pair_shop", ["/shop/category/3"]))
    worker = start_worker(tmp_path, redis_url, namespace, name="news-only", spider="pair_news")
    assert worker.wait(120) == 0, worker.log()[-3000:]
    assert stored_docs(tmp_path / "items.db") == {}
    rows = {row["spider"]: row for row in status_json(redis_url, namespace)["spiders"]}
    assert rows["pair_shop"] == {"spider": "pair_shop", "backlog": 1, "pending": 0,
                                 "delayed": 0, "workers": 0, "unserved": True}


def test_unnamed_tasks_shared_by_two_spiders_warn_once(
        tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite) -> None:
    store = tmp_path / "items.db"
    workers = [start_worker(tmp_path, redis_url, namespace, name=spider, store=store,
                            spider=spider, METEORSEED_IDLE_CLOSE=5)
               for spider in ("pair_news", "pair_shop")]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = KeyLayout(namespace)
    # Both listed and alive before the tasks come: whoever reads first sees the other.
    wait_for(lambda: len(client.hgetall(keys.spider_workers)) == 2
             and client.zcard(keys.workers) == 2, timeout=60)
    paths = [f"/news/article/{i}" for i in range(1, 31)]
    add_tasks(redis_url, namespace, seed_tasks(demo_site, None, paths))
    for worker in workers:
        assert worker.wait(180) == 0, worker.log()[-3000:]
    docs = stored_docs(store)
    assert sorted(d["url"].split(demo_site.url)[1] for d in docs.values()) == sorted(paths)
    warned = [w for w in workers if SHARED_WARNING in w.log()]
    assert warned, [w.log()[-2000:] for w in workers]
    for worker in warned:
        assert worker.log().count(SHARED_WARNING) == 1


def test_two_spiders_on_a_cluster_with_shards(tmp_path: Path, cluster: LocalCluster, ns: str,
                                              demo_site: DemoSite) -> None:
    """Each spider's task set lives in its shard's slot: scripts over a shard's default and
    spider streams (read, defer, take-over) work on a Redis Cluster."""
    shards = 4
    keys = KeyLayout(ns, shards, cluster=True).with_spiders(["pair_news", "pair_shop"])
    for shard in keys.shard_keys:
        slots = {key_slot(k.encode()) for k in (*shard.streams, *shard.delayeds, shard.dead)}
        assert len(slots) == 1
    tasks = [*(seed_tasks(demo_site, "pair_news", [f"/news/list/{p}"], site_id=f"news{p}")
               for p in (1, 2, 3)),
             *(seed_tasks(demo_site, "pair_shop", [f"/shop/category/{c}"], site_id=f"shop{c}")
               for c in (1, 2, 3))]
    store = tmp_path / "items.db"
    enqueue(cluster.url, KeyLayout(ns, shards, cluster=True), [t for g in tasks for t in g])
    workers = [start_worker(tmp_path, cluster.url, ns, name=spider, store=store, spider=spider,
                            METEORSEED_STREAM_SHARDS=shards, METEORSEED_SITE_RATE=100,
                            METEORSEED_SITE_BURST=20)
               for spider in ("pair_news", "pair_shop")]
    for worker in workers:
        assert worker.wait(240) == 0, worker.log()[-3000:]
    kinds = {(d["parsed_by"], d["url"].split("/")[3]) for d in stored_docs(store).values()}
    assert kinds == {("pair_news", "news"), ("pair_shop", "shop")}
    assert len(stored_docs(store)) == 3 * 11 * 2

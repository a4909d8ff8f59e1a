"""A task settles (and is acked) as soon as its callback's output ran out and every item of it
is committed, not when Scrapy's own bookkeeping of its items ends some turns of the event loop
later; and never before: every item committed, every child durable, no error.

The probe project's ``SettleWatch`` holds every ``item_scraped`` handler call of a task until
the task settles (or a fallback delay passes), and records how many of the task's documents
the store held at the settle. A worker that settles only once Scrapy is done with the items
would wait for the fallback every time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker, stored_docs


def _crawl(tmp_path: Path, redis_url: str, namespace: str, urls: list[str],
           **settings: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    tasks = enqueue(redis_url, namespace, urls)
    watch = tmp_path / "watch.json"
    worker = start_worker(tmp_path, redis_url, namespace, SETTLE_WATCH_FILE=watch,
                          CONCURRENT_REQUESTS=16, **settings)
    assert worker.wait() == 0, worker.log()[-3000:]
    seen = json.loads(watch.read_text())
    by_url = {t.task_id: t.url for t in tasks}
    seen["settles"] = {by_url[tid]: tuple(v) for tid, v in seen["settles"].items()}
    return seen, worker.stats()


def test_a_task_settles_when_its_last_item_is_committed_not_when_scrapy_is_done_with_it(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    # 12 items a page (held item_scraped calls each hold one of CONCURRENT_ITEMS = 16
    # workers: a page of more would wait for the fallback), 16 pages at once, so a page's items
    # go in several store batches.
    urls = [f"{demo_site.url}/news/article/{i}?many=12" for i in range(1, 21)]
    seen, stats = _crawl(tmp_path, redis_url, namespace, urls, SETTLE_WATCH_HOLD=30)
    assert seen["settles"] == {url: ("done", 12) for url in urls}  # all 12 stored, each time
    assert seen["released"]["timeout"] == 0  # no item's end waited for the fallback
    assert seen["released"]["settle"] + seen["released"]["after"] == 20 * 12
    assert stats["meteorseed/acked"] == 20
    assert len(stored_docs(tmp_path / "items.db")) == 20 * 12
    assert sync_redis.xlen(KeyLayout(namespace).dead) == 0


def test_items_dropped_before_the_store_stage_are_through_when_scrapy_drops_them(
    tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite
) -> None:
    urls = [f"{demo_site.url}/news/article/{i}?many=21" for i in range(1, 9)]  # 11 held at most
    seen, stats = _crawl(tmp_path, redis_url, namespace, urls, SETTLE_WATCH_HOLD=30,
                         ITEM_PIPELINES=json.dumps({"probe.pipelines.DropOdd": 100}))
    assert seen["settles"] == {url: ("done", 11) for url in urls}  # #0, #2 ... #20
    assert seen["released"]["timeout"] == 0
    assert seen["released"]["settle"] + seen["released"]["after"] == 8 * 11
    assert stats["meteorseed/acked"] == 8
    assert stats["item_dropped_count"] == 8 * 10


def test_behind_a_later_item_stage_a_task_waits_until_scrapy_is_done_with_its_items(
    tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite
) -> None:
    # A stage after the store could still fail a committed item: then the task must not
    # have been acked, so it settles only after Scrapy's end of every item (item_scraped).
    urls = [f"{demo_site.url}/news/article/{i}?many=3" for i in range(1, 5)]
    seen, stats = _crawl(tmp_path, redis_url, namespace, urls, SETTLE_WATCH_HOLD=1,
                         ITEM_PIPELINES=json.dumps({"probe.pipelines.Passthrough": 950}))
    assert seen["released"] == {"settle": 0, "timeout": 4 * 3, "after": 0}
    assert seen["settles"] == {url: ("done", 3) for url in urls}
    assert stats["meteorseed/acked"] == 4


def test_a_callback_failing_after_its_items_were_committed_leaves_its_task_unacked(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    good = [f"{demo_site.url}/news/article/{i}?many=5" for i in range(1, 5)]
    bad = f"{demo_site.url}/news/article/9?many=5&fail=1"
    # (A failed task settles once Scrapy is done with its items: those of `bad` wait for the
    # fallback, kept short since nothing here counts how items were released.)
    seen, stats = _crawl(tmp_path, redis_url, namespace, [*good, bad], SETTLE_WATCH_HOLD=1)
    # Its 5 items are stored, its task not acked: dead-lettered at once (a bug in the spider).
    assert seen["settles"][bad] == ("dead", 5)
    assert {url: seen["settles"][url] for url in good} == {url: ("done", 5) for url in good}
    assert stats["meteorseed/acked"] == 4
    (dead,) = sync_redis.xrange(KeyLayout(namespace).dead)
    assert "failed after 5 items" in dead[1]["reason"]

"""Scrapy settings the add-on changes for the worker's sake, and what a project keeps."""

from __future__ import annotations

from pathlib import Path

import redis
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.addon import CONCURRENT_ITEMS
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker, stored_docs

ADDONS = {"ADDONS": {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}}


def test_the_addon_lowers_concurrent_items_and_a_project_keeps_its_own() -> None:
    assert get_crawler(settings_dict=ADDONS).settings.getint("CONCURRENT_ITEMS") == 16
    assert get_crawler().settings.getint("CONCURRENT_ITEMS") > CONCURRENT_ITEMS  # Scrapy's 100
    mine = get_crawler(settings_dict={**ADDONS, "CONCURRENT_ITEMS": 250})
    assert mine.settings.getint("CONCURRENT_ITEMS") == 250


def test_pages_of_many_items_are_all_committed_before_their_ack(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    # 45 items a page, 16 processed at once: each page's items go in several store batches,
    # and its task is acked only after the last of them.
    urls = [f"{demo_site.url}/news/article/{i}?many=45" for i in range(1, 13)]
    enqueue(redis_url, namespace, urls)
    worker = start_worker(tmp_path, redis_url, namespace)
    assert worker.wait() == 0, worker.log()[-3000:]
    docs = stored_docs(tmp_path / "items.db")
    assert set(docs) == {f"probe:/news/article/{i}?many=45#{n}"
                         for i in range(1, 13) for n in range(45)}
    stats = worker.stats()
    assert stats["meteorseed/acked"] == 12
    assert stats.get("meteorseed/store/committed") == 12 * 45
    assert sync_redis.xlen(KeyLayout(namespace).dead) == 0

"""End to end: how failures that are not the site's end a task, with 16 requests in flight.

A failure of Scrapy's own scraper settles its task (not acked: delivered again), so the crawl
ends; the site sees each page once for such failures with ``METEORSEED_MAX_DELIVERIES=1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import Worker, enqueue, start_worker, stored_docs

pytestmark = pytest.mark.e2e


def _pages(site: DemoSite, namespace: str, n: int, query: str = "") -> list[str]:
    # (the namespace in the query: the demo site is shared by the session, its hits exact)
    return [f"{site.url}/news/article/{i}?n={namespace}{query}" for i in range(1, n + 1)]


def _crawl(tmp_path: Path, redis_url: str, namespace: str, urls: list[str],
           **settings: Any) -> Worker:
    enqueue(redis_url, namespace, urls)
    worker = start_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=16,
                          METEORSEED_CLAIM_IDLE=0.5, METEORSEED_MAX_DELIVERIES=1, **settings)
    assert worker.wait(timeout=90) == 0, worker.log()[-3000:]
    return worker


def _dead(sync_redis: redis.Redis, namespace: str) -> dict[str, str]:
    """url path -> dead letter reason."""
    dead: dict[str, str] = {}
    for _, fields in sync_redis.xrange(KeyLayout(namespace).dead):
        task = fields["t"]
        path = task.split("/news/article/", 1)[1].split('"', 1)[0]
        dead[path] = fields["reason"]
    return dead


@pytest.mark.parametrize("mode", ["sync", "deferred"])
def test_a_failing_scraper_settles_its_task_and_the_crawl_ends(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    demo_site: DemoSite, mode: str
) -> None:
    good = _pages(demo_site, namespace, 20)
    bad = [f"{url}&scrapefault=1" for url in _pages(demo_site, namespace, 4, "&b=1")]
    worker = _crawl(tmp_path, redis_url, namespace, [*good, *bad], PROBE_SCRAPE_FAULT=mode)

    stats = worker.stats()
    assert stats["meteorseed/acked"] == 20
    assert stats["meteorseed/outcome/failed"] == 4  # not acked: delivered again, then dead
    dead = _dead(sync_redis, namespace)
    assert len(dead) == 4
    for reason in dead.values():
        assert "more than METEORSEED_MAX_DELIVERIES=1" in reason
        assert "scraper error: RuntimeError: scraper fault" in reason
    for url in [*good, *bad]:
        assert demo_site.hits(url[len(demo_site.url):]) == 1
    assert len(stored_docs(tmp_path / "items.db")) == 20


FAILING_FINGERPRINTER = "probe.fingerprinter.FailingFingerprinter"


def test_a_fingerprinter_failing_for_one_child_fails_its_parent_alone(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    # 20 parents, each yielding a child the fingerprinter takes and one it fails for.
    parents = _pages(demo_site, namespace, 20, "&kids=1")
    worker = _crawl(tmp_path, redis_url, namespace, parents,
                    REQUEST_FINGERPRINTER_CLASS=FAILING_FINGERPRINTER)

    stats = worker.stats()
    assert "Unexpected error" not in worker.log()
    assert stats["meteorseed/children/rejected"] == 20
    assert stats["meteorseed/children/enqueued"] == 20
    assert stats["meteorseed/acked"] == 20  # the good children
    dead = _dead(sync_redis, namespace)
    assert len(dead) == 20
    for i in range(1, 21):
        reason = dead[f"{i}?n={namespace}&kids=1"]
        assert f"yielded request {demo_site.url}/news/article/{i + 40}?n={namespace}&fpfail=1"\
            in reason
        assert "url: cannot be fingerprinted" in reason and "ValueError" in reason
        assert demo_site.hits(f"/news/article/{i + 20}?n={namespace}") == 1
        assert demo_site.hits(f"/news/article/{i + 40}?n={namespace}&fpfail=1") == 0
    for url in parents:
        assert demo_site.hits(url[len(demo_site.url):]) == 1
    # Everything the parents produced but the refused child went on: items and good children.
    assert len(stored_docs(tmp_path / "items.db")) == 40


def test_a_fingerprinter_failing_for_a_start_request_stops_the_engine_as_on_scrapy(
    tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite
) -> None:
    start = f"{demo_site.url}/news/article/1?n={namespace}&fpfail=1"
    worker = start_worker(tmp_path, redis_url, namespace, spider_args={"start_urls_csv": start},
                          REQUEST_FINGERPRINTER_CLASS=FAILING_FINGERPRINTER)
    assert worker.wait(timeout=90) == 0, worker.log()[-3000:]
    log = worker.log()
    # (Scrapy's tests/test_engine.py::test_start_request_processing_exception checks these)
    assert "Error while processing requests from start()" in log
    assert "Spider closed (shutdown)" in log
    assert "Unexpected error" not in log
    assert demo_site.hits(start[len(demo_site.url):]) == 0

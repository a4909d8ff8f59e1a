"""End to end: how failures that are not the site's end a task, with 16 requests in flight.

A bug in the spider (callback, errback, item pipeline, fingerprinter) costs the site one fetch,
as on stock Scrapy: its task is dead-lettered at once with the error as its reason, after the
rest of its output went through. A failure of Scrapy's own scraper settles its task (not acked:
delivered again), so the crawl ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import Worker, enqueue, start_worker, stored_docs
from tests.test_e2e_errback import enqueue_with_errback, start_errback_worker

pytestmark = pytest.mark.e2e


def _pages(site: DemoSite, namespace: str, n: int, query: str = "") -> list[str]:
    # (the namespace in the query: the demo site is shared by the session, its hits exact)
    return [f"{site.url}/news/article/{i}?n={namespace}{query}" for i in range(1, n + 1)]


def _crawl(tmp_path: Path, redis_url: str, namespace: str, urls: list[str],
           **settings: Any) -> Worker:
    enqueue(redis_url, namespace, urls)
    # (delivered again within half a second when a task is not settled for good)
    settings = {"METEORSEED_CLAIM_IDLE": 0.5, "METEORSEED_MAX_DELIVERIES": 1, **settings}
    worker = start_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=16, **settings)
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


def test_a_raising_callback_costs_the_site_one_fetch_and_dead_letters_its_task_at_once(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    good = _pages(demo_site, namespace, 20)
    # Each yields 3 items, then raises: as on Scrapy its items are kept, spider_error fires once.
    bad = _pages(demo_site, namespace, 8, "&many=3&fail=1")
    worker = _crawl(tmp_path, redis_url, namespace, [*good, *bad], METEORSEED_MAX_DELIVERIES=5)

    for url in [*good, *bad]:
        assert demo_site.hits(url[len(demo_site.url):]) == 1  # never fetched again
    stats = worker.stats()
    assert stats["spider_exceptions/count"] == 8 and stats["spider_exceptions/ValueError"] == 8
    assert stats["meteorseed/acked"] == 20 and stats["meteorseed/outcome/dead"] == 8
    assert "meteorseed/outcome/failed" not in stats
    dead = {path: reason for path, reason in _dead(sync_redis, namespace).items()}
    assert len(dead) == 8
    for i in range(1, 9):
        reason = dead[f"{i}?n={namespace}&many=3&fail=1"]
        first, *frames = reason.splitlines()
        assert first == (f"callback error: ValueError: failed after 3 items at "
                         f"/news/article/{i}?n={namespace}&many=3&fail=1")
        assert frames[-1].endswith(", in parse") and "probe.py" in frames[-1]
    for _, fields in sync_redis.xrange(KeyLayout(namespace).dead):
        assert fields["deliveries"] == "1"
    assert len(stored_docs(tmp_path / "items.db")) == 20 + 8 * 3


def test_a_raising_item_pipeline_dead_letters_its_task_once_its_other_items_are_committed(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    good = _pages(demo_site, namespace, 20, "&many=3")
    bad = _pages(demo_site, namespace, 4, "&many=3&pipefail=1")
    worker = _crawl(tmp_path, redis_url, namespace, [*good, *bad], METEORSEED_MAX_DELIVERIES=5,
                    ITEM_PIPELINES='{"probe.pipelines.FailSecond": 100}')

    for url in [*good, *bad]:
        assert demo_site.hits(url[len(demo_site.url):]) == 1
    stats = worker.stats()
    assert stats["meteorseed/acked"] == 20 and stats["meteorseed/outcome/dead"] == 4
    dead = _dead(sync_redis, namespace)
    assert len(dead) == 4
    for reason in dead.values():
        assert reason.startswith("item not committed: ValueError: pipeline bug at ")
        assert ", in process_item" in reason
    assert len(stored_docs(tmp_path / "items.db")) == 20 * 3 + 4 * 2  # the other items


def test_a_raising_errback_costs_the_site_one_fetch(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    # A 404 is terminal (acked); its errback (HttpError) raising is a bug in the spider.
    gone = [f"{demo_site.url}/status/404?raise=1&p={i}&n={namespace}" for i in range(16)]
    ok = [f"{demo_site.url}/status/404?handle=1&p={i}&n={namespace}" for i in range(4)]
    enqueue_with_errback(redis_url, namespace, [*gone, *ok])
    worker = start_errback_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=16,
                                  METEORSEED_CLAIM_IDLE=0.5)
    assert worker.wait(timeout=90) == 0, worker.log()[-3000:]

    for url in [*gone, *ok]:
        assert demo_site.hits(url[len(demo_site.url):]) == 1
    stats = worker.stats()
    assert stats["probe/errback"] == 20 and stats["spider_exceptions/RuntimeError"] == 16
    assert stats["meteorseed/acked"] == 4  # handled by the errback's item
    reasons = [f["reason"] for _, f in sync_redis.xrange(KeyLayout(namespace).dead)]
    assert len(reasons) == 16
    assert all(r.startswith("callback error: RuntimeError: errback bug at /status/404")
               and ", in on_error" in r for r in reasons)

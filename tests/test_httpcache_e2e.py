"""A code spider re-parses with Scrapy's own HttpCacheMiddleware under the add-on: a crawl with
``HTTPCACHE_ENABLED`` fills the cache; the same tasks again with ``HTTPCACHE_IGNORE_MISSING``
are parsed from it, stored and acked, with 0 requests to the site (docs/sites.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import enqueue, start_worker, stored_docs

from meteorseed_scrapy.testing.metered_site import MeteredSite

pytestmark = pytest.mark.e2e


def test_stream_tasks_are_answered_from_scrapys_http_cache(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any) -> None:
    cache: dict[str, Any] = {"HTTPCACHE_ENABLED": True,
                             "HTTPCACHE_DIR": str(tmp_path / "httpcache")}
    with MeteredSite() as site:
        urls = [f"{site.url}/news/article/{n}" for n in range(1, 6)]
        enqueue(redis_url, namespace, urls)
        first = start_worker(tmp_path, redis_url, namespace, name="fetch", **cache)
        assert first.wait() == 0, first.log()[-3000:]
        before = stored_docs(tmp_path / "items.db")
        assert len(before) == 5 and site.meter(reset=True)["requests"] == 5

        missing = f"{site.url}/news/article/9"
        enqueue(redis_url, namespace, [*urls, missing], dedup=False)
        again = start_worker(tmp_path, redis_url, namespace, name="reparse",
                             HTTPCACHE_IGNORE_MISSING=True, **cache)
        assert again.wait() == 0, again.log()[-3000:]
        assert site.meter()["requests"] == 0
    after = stored_docs(tmp_path / "items.db")
    assert set(after) == set(before)  # the page not in the cache: ignored, never fetched
    for key, doc in after.items():
        assert doc["updated_at"] > before[key]["updated_at"]
        assert doc["first_seen_at"] == before[key]["first_seen_at"]
        assert doc["title"] == before[key]["title"]
    stats = again.stats()
    assert stats.get("httpcache/hit") == 5 and stats.get("httpcache/miss") == 1
    assert sync_redis.xlen(f"{namespace}:tasks") == 0  # every task settled
    assert sync_redis.xlen(f"{namespace}:dead") == 0  # the missing page too: ignored, acked

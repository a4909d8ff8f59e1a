"""SitesPipeline: anomalies to the anomaly store, reposts marked or skipped (real Redis)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from scrapy.exceptions import DropItem
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.sites.model import Dedup
from meteorseed_scrapy.sites.pipeline import SiteItem, SitesPipeline
from meteorseed_scrapy.sites.quality import AnomalyTracker
from meteorseed_scrapy.sites.reposts import content_fingerprint
from meteorseed_scrapy.sites.schema import parse_site
from meteorseed_scrapy.store.backends import open_store


class _Crawler:
    def __init__(self) -> None:
        self.settings = Settings()
        self.stats = MemoryStatsCollector(self)  # type: ignore[arg-type]


def run(pipeline: SitesPipeline, *items: SiteItem) -> list[Any]:
    async def go() -> list[Any]:
        out: list[Any] = []
        for item in items:
            try:
                out.append(await pipeline.process_item(item))
            except DropItem as exc:
                out.append(exc)
        await pipeline.close_spider()
        return out

    return asyncio.run(go())


def article(key: str, title: str, body: str, mode: str = "mark", **extra: Any) -> SiteItem:
    return SiteItem("news", "7", f"http://news.example/{key}", key,
                    {"title": title, "body": body, **extra},
                    dedup=Dedup(mode=mode, title="title", content="body"))


@pytest.fixture
def pipeline(tmp_path: Path, redis_url: str, namespace: str) -> SitesPipeline:
    return SitesPipeline(f"sqlite:///{tmp_path}/s.db", redis_url, KeyLayout(namespace),
                         _Crawler().stats)


def test_anomaly_goes_to_the_anomaly_store(pipeline: SitesPipeline, tmp_path: Path) -> None:
    bad = SiteItem("news", "7", "http://news.example/1", "1", {"title": None, "body": "x"},
                   raw={"title": ""}, reasons=["title: required but empty"])
    (dropped,) = run(pipeline, bad)
    assert isinstance(dropped, DropItem) and "kept in the anomalies store" in str(dropped)
    store = open_store(f"sqlite:///{tmp_path}/s.db", pipeline.keys.namespace)
    (doc,) = list(store.iter_anomalies())
    assert doc["_id"] == "news:1" and doc["reasons"] == ["title: required but empty"]
    assert doc["rule_version"] == "7" and doc["fields"] == {"title": None, "body": "x"}
    assert doc["url"] == "http://news.example/1" and store.count() == 0
    store.close()


def test_good_item_leaves_as_a_plain_dict_with_its_version(pipeline: SitesPipeline) -> None:
    (out,) = run(pipeline, article("1", "Hello", "World", mode="off"))
    assert out == {"title": "Hello", "body": "World", "url": "http://news.example/1",
                   "rule_version": "7", "unique_key": "1"}


def test_repost_under_another_url_is_marked(pipeline: SitesPipeline, sync_redis: Any,
                                            namespace: str) -> None:
    body = "The council met on Tuesday. " * 10
    first, repost, recrawl = run(
        pipeline,
        article("1", "Council meets", body),
        article("2", "  COUNCIL meets!", body.upper() + " Shared from elsewhere."),
        article("1", "Council meets", body),
    )
    assert "duplicate_of" not in first
    assert repost["duplicate_of"] == "news:1"
    assert repost["content_fingerprint"] == first["content_fingerprint"]
    assert "duplicate_of" not in recrawl  # the same document again is no repost
    key = KeyLayout(namespace).content_fingerprint("news", first["content_fingerprint"])
    assert sync_redis.get(key) == "news:1"
    assert 29 * 86400 < sync_redis.ttl(key) <= 30 * 86400


def test_repost_is_skipped_when_the_site_says_so(pipeline: SitesPipeline) -> None:
    first, repost = run(pipeline, article("1", "T", "same", mode="skip"),
                        article("2", "T", "same", mode="skip"))
    assert isinstance(first, dict) and isinstance(repost, DropItem)
    assert "repost of news:1" in str(repost)


def test_fingerprint_ignores_case_punctuation_and_text_past_100_chars() -> None:
    content = "x" * 100
    same = content_fingerprint("big  news", content)
    assert content_fingerprint("Big News!", content + " tail") == same
    assert content_fingerprint("Big News", content) != content_fingerprint("Other news", content)


def test_anomaly_rate_jump_is_flagged(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_site({"site_id": "s", "version": 3, "list": {"links": "a"},
                         "fields": {"t": "h1"}}, "s.yaml")
    stats = _Crawler().stats
    tracker = AnomalyTracker(stats, window=10)
    flagged = [tracker.record(config, anomalous=(i % 10 == 0)) for i in range(30)]
    assert not any(flagged)  # a steady 10 % is the site's level, not a jump
    with caplog.at_level(logging.WARNING, logger="meteorseed_scrapy.sites.quality"):
        flagged = [tracker.record(config, anomalous=True) for _ in range(10)]
    assert flagged.count(True) == 1
    assert "jumped from 11% to 70% over the last 10 items" in caplog.text
    assert "rule version 3" in caplog.text
    assert stats.get_value("meteorseed/anomalies/s/jumps") == 1
    assert stats.get_value("meteorseed/anomalies/s/count") == 13
    assert stats.get_value("meteorseed/anomalies/s") == round(13 / 40, 4)


def syndicated(site: str, key: str, mode: str = "mark") -> SiteItem:
    body = "The council met on Tuesday to vote on the budget. " * 5
    return SiteItem(site, "1", f"http://{site}.example/{key}", key,
                    {"title": "Council votes budget", "body": body},
                    dedup=Dedup(mode=mode, title="title", content="body", window=3600))


@pytest.mark.parametrize("mode", ["mark", "skip"])
def test_reposts_across_sites_when_the_namespace_matches_them(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any, mode: str) -> None:
    across = SitesPipeline(f"sqlite:///{tmp_path}/s.db", redis_url, KeyLayout(namespace),
                           across_sites=True)
    first, other_site, again = run(across, syndicated("wire", "1", mode),
                                   syndicated("paper", "77", mode),
                                   syndicated("wire", "1", mode))
    assert "duplicate_of" not in first and "duplicate_of" not in again
    if mode == "mark":
        assert other_site["duplicate_of"] == "wire:1"
    else:
        assert isinstance(other_site, DropItem) and "repost of wire:1" in str(other_site)
    key = KeyLayout(namespace).content_fingerprint_any(first["content_fingerprint"])
    assert key == f"{namespace}:fp:{first['content_fingerprint']}"
    assert sync_redis.get(key) == "wire:1" and 3500 < sync_redis.ttl(key) <= 3600
    assert sync_redis.keys(f"{namespace}:{{*}}:fp:*") == []  # no per-site index written


def test_reposts_stay_per_site_by_default(tmp_path: Path, redis_url: str,
                                          namespace: str) -> None:
    per_site = SitesPipeline(f"sqlite:///{tmp_path}/s.db", redis_url, KeyLayout(namespace))
    first, other_site = run(per_site, syndicated("wire", "1"), syndicated("paper", "77"))
    assert "duplicate_of" not in first and "duplicate_of" not in other_site


def test_the_setting_reaches_the_pipeline(redis_url: str, namespace: str) -> None:
    crawler = _Crawler()
    crawler.settings.set("METEORSEED_REPOSTS_ACROSS_SITES", "true")
    assert SitesPipeline.from_crawler(crawler).across_sites  # type: ignore[arg-type]
    assert not SitesPipeline.from_crawler(_Crawler()).across_sites  # type: ignore[arg-type]

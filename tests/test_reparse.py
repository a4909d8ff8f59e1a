"""The re-parse engine in-process: anomalies kept apart as a worker keeps them, a page the rules
cannot parse counted and named, a callback that is not the rule spider's refused, and no Redis
connection for a site without content dedup (the Redis URL refuses connections)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.pipeline import SitesPipeline
from meteorseed_scrapy.sites.reparse import Reparser, ReparseResult
from meteorseed_scrapy.sites.rulefile import FileResult
from meteorseed_scrapy.sites.schema import parse_site
from meteorseed_scrapy.sites.spider import RuleSpider
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.documents import utc_timestamp
from meteorseed_scrapy.store.page_cache import CachedPage, encode, open_page_cache
from meteorseed_scrapy.testing.demo_pages import article

RULES = {"site_id": "news", "version": "3", "start": "detail", "list": {"links": "a"},
         "fields": {"article_id": {"from_url": True, "regex": r"/a/(\d+)"},
                    "title": "h1.title::text", "summary": ".summary::text"},
         "unique_key": "article_id", "required": ["title"]}


def cached(n: int, body: bytes, callback: str = "parse_detail") -> CachedPage:
    url = f"http://news.example/a/{n}"
    return CachedPage(site_id="news", url=url, status=200,
                      headers={"Content-Type": ["text/html; charset=utf-8"]}, body=body,
                      fetched_at=utc_timestamp(), callback=callback, meta={"sites_depth": 1},
                      task={"task_id": f"task-{n}", "seed_id": "seed-1", "url": url})


def reparse(tmp_path: Path, refused_port: int, rules: dict[str, Any]) -> ReparseResult:
    uri = f"sqlite:///{tmp_path}/items.db"
    cache = open_page_cache(uri, "ns")
    cache.put([encode(cached(1, article(1))), encode(cached(2, b"<html><p>no title</p>")),
               encode(cached(3, article(3), callback="steal_cookies"))])
    registry = SiteRegistry(None)
    registry.apply([FileResult(tmp_path / "news.yaml", (0, 0),
                               config=parse_site(rules, "news.yaml"))])
    store = open_store(uri, "ns")
    pipeline = SitesPipeline(uri, f"redis://127.0.0.1:{refused_port}/0", KeyLayout("ns"))

    async def run() -> ReparseResult:
        try:
            return await Reparser(RuleSpider(registry=registry, reload_interval=0), cache,
                                  store, pipeline).run("news", "")
        finally:
            await pipeline.close_spider()

    try:
        return asyncio.run(run())
    finally:
        cache.close()
        store.close()


def test_anomalies_and_bad_entries_without_redis(tmp_path: Path, refused_port: int) -> None:
    result = reparse(tmp_path, refused_port, RULES)
    assert (result.pages, result.items, result.anomalies, result.unreadable) == (2, 1, 1, 1)
    assert "callback 'steal_cookies' is not the rule spider's" in result.problems[0]
    store = open_store(f"sqlite:///{tmp_path}/items.db", "ns")
    (doc,) = store.iter_docs()
    assert doc["_id"] == "news:1" and doc["rule_version"] == "3"
    assert (doc["seed_id"], doc["task_id"]) == ("seed-1", "task-1")
    (anomaly,) = store.iter_anomalies()
    assert anomaly["_id"] == "news:2" and "title" in anomaly["reasons"][0]
    store.close()


def test_a_page_the_rules_cannot_parse_is_counted_and_named(tmp_path: Path,
                                                            refused_port: int) -> None:
    result = reparse(tmp_path, refused_port, {**RULES, "format": "json",
                                              "fields": {"article_id": "id"}, "required": []})
    assert result.failed == 2 and result.items == 0
    assert any("http://news.example/a/1: not parsed" in p for p in result.problems)


def test_an_entry_carries_no_meta_but_the_rule_spider_s() -> None:
    from meteorseed_scrapy.sites.reparse import page_response

    config = parse_site(RULES, "news.yaml")
    page = cached(1, article(1))
    hostile = CachedPage(**{**page.__dict__, "task": {},
                            "meta": {"site_id": "other", "sites_depth": 2, "sites_page": "9",
                                     "proxy": "http://attacker", "meteorseed_task": "x"}})
    meta = page_response(config, hostile).meta
    assert meta["site_id"] == "news" and meta["sites_depth"] == 2
    assert not {"sites_page", "proxy", "meteorseed_task"} & set(meta)

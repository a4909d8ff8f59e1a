"""The sites spider closes its registry (and so the Redis client of the pushed rules) once, and
never under a reload that still reads with it in its thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from scrapy import signals
from scrapy.utils.test import get_crawler
from twisted.internet.defer import Deferred

from meteorseed_scrapy.sites import spider as spider_module
from meteorseed_scrapy.sites.rulefile import FileResult
from meteorseed_scrapy.sites.spider import RuleSpider


@pytest.fixture
def spider(tmp_path: Path, redis_url: str, namespace: str) -> RuleSpider:
    crawler = get_crawler(settings_dict={"METEORSEED_SITES_DIR": str(tmp_path),
                                         "METEORSEED_SITES_REDIS": True,
                                         "METEORSEED_REDIS_URL": redis_url,
                                         "METEORSEED_NAMESPACE": namespace,
                                         "EXTENSIONS_BASE": {}})  # no crawl ran: no stats to close
    return RuleSpider.from_crawler(crawler)


def noted(spider: RuleSpider, events: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Notes "closed" in ``events`` at each close of the spider's registry."""
    close = spider.registry.close

    def noted_close() -> None:
        events.append("closed")
        close()

    monkeypatch.setattr(spider.registry, "close", noted_close)


def close_spider(spider: RuleSpider) -> None:
    spider.crawler.signals.send_catch_log(signals.spider_closed, spider=spider,
                                          reason="finished")


def test_an_idle_spider_closes_its_registry_at_once(
        spider: RuleSpider, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    noted(spider, events, monkeypatch)
    close_spider(spider)
    assert events == ["closed"]


def test_a_reload_in_its_thread_at_close_closes_the_registry_as_it_ends(
        spider: RuleSpider, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed under the reload, the client could hang it (redis-py: a connect waiting for its
    handshake's reply); left open, it waited for garbage collection. The reload is held in its
    thread until spider_closed has fired; its result reaches the reactor only after that."""
    events: list[str] = []
    reading, release = threading.Event(), threading.Event()
    poll = spider.registry.poll

    def held_poll() -> list[FileResult]:
        reading.set()
        assert release.wait(30), "the reload was never released"
        try:
            return poll()  # reads the pushed rules in Redis, with the client closed next
        finally:
            events.append("reload ended")

    # A real thread, as deferToThread's; the result is delivered as the reactor would.
    started: list[tuple[threading.Thread, Deferred[Any], list[Any]]] = []

    def in_a_thread(read: Callable[[], Any]) -> Deferred[Any]:
        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(read()))
        started.append((thread, Deferred(), result))
        thread.start()
        return started[-1][1]

    monkeypatch.setattr(spider.registry, "poll", held_poll)
    monkeypatch.setattr(spider_module.threads, "deferToThread", in_a_thread)
    noted(spider, events, monkeypatch)
    spider._poll()
    assert reading.wait(30), "the reload never started"
    close_spider(spider)
    assert events == []  # nothing closed under the reload
    release.set()
    [(thread, delivered, result)] = started
    thread.join(30)
    assert not thread.is_alive()
    assert result == [[]], "the reload failed"
    delivered.callback(result[0])
    assert events == ["reload ended", "closed"]

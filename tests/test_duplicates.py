"""Duplicates of yielded requests are reported as Scrapy reports them (``request_dropped``,
``dupefilter/filtered``, RFPDupeFilter's log line), and ``DUPEFILTER_CLASS`` is honoured:
Scrapy's default = the fleet-wide dedup, ``BaseDupeFilter`` = none, another class = its own
``request_seen()`` first, then the fleet-wide dedup; scrapy-redis's refused at open."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy import Request, signals
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.testing.polling import wait_until
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.duplicates import Duplicates
from tests.test_pump import Rig, ShopSpider, make_task, ok, run

FIRST = ("Filtered duplicate request: <GET https://shop.test/a> - no more duplicates will be "
         "shown (see DUPEFILTER_DEBUG to show all duplicates)")


class DropMarked(BaseDupeFilter):
    """A project's own dupefilter: ``?drop`` URLs are duplicates."""

    logged: list[str] = []

    def request_seen(self, request: Request) -> bool:
        return "drop" in request.url

    def log(self, request: Request, spider: Any) -> None:
        self.logged.append(request.url)


def _yield(rig: Rig, urls: list[tuple[str, bool]]) -> Any:
    """A task whose callback yields ``(url, dont_filter)`` requests; the requests dropped, the
    child() answers and the URLs written to the stream, once the task is acked."""

    async def body() -> tuple[list[str], list[bool], list[str]]:
        dropped: list[str] = []
        rig.spider.crawler = SimpleNamespace(stats=rig.stats)  # (RFPDupeFilter.log counts there)
        rig.pump._signals.connect(lambda request, spider: dropped.append(request.url),
                                  signals.request_dropped, weak=False)
        await rig.enqueue(make_task(0))
        request = await rig.take()
        scrape = rig.pump.scrape_started(request)
        answers = [rig.pump.child(scrape, Request(u, dont_filter=d)) for u, d in urls]
        rig.pump.finished(request, ok(request))
        await wait_until(lambda: rig.stats.get_value("meteorseed/acked") == 1)
        written = [f["t"] for s in rig.keys.streams for _, f in await rig.client.xrange(s)]
        return dropped, answers, [w.split('"url":"')[1].split('"')[0] for w in written]

    return body()


def test_a_duplicate_is_dropped_with_the_signal_the_stat_and_scrapys_log_line(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    urls = [("https://shop.test/a", False), ("https://shop.test/a", False),
            ("https://shop.test/a", True), ("https://shop.test/a", False)]
    caplog.set_level(logging.DEBUG, "scrapy.dupefilters")
    dropped, answers, written = run(redis_url, namespace, lambda rig: _yield(rig, urls))
    assert dropped == ["https://shop.test/a", "https://shop.test/a"]
    assert answers == [True] * 4
    assert sorted(written) == ["https://shop.test/a", "https://shop.test/a"]  # (dont_filter)
    assert [r.getMessage() for r in caplog.records if r.name == "scrapy.dupefilters"] == [FIRST]


def test_dupefilter_debug_logs_every_duplicate_and_counts_them(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    urls = [("https://shop.test/a", False)] * 3
    caplog.set_level(logging.DEBUG, "scrapy.dupefilters")

    async def body(rig: Rig) -> Any:
        out = await _yield(rig, urls)
        return out, rig.stats.get_value("dupefilter/filtered")

    (dropped, _, written), filtered = run(redis_url, namespace, body, DUPEFILTER_DEBUG=True)
    assert len(dropped) == 2 and filtered == 2 and written == ["https://shop.test/a"]
    lines = [r.getMessage() for r in caplog.records if r.name == "scrapy.dupefilters"]
    assert lines == ["Filtered duplicate request: <GET https://shop.test/a> (referer: None)"] * 2


def test_base_dupefilter_turns_dedup_off(redis_url: str, namespace: str) -> None:
    urls = [("https://shop.test/a", False)] * 3
    dropped, answers, written = run(
        redis_url, namespace, lambda rig: _yield(rig, urls),
        DUPEFILTER_CLASS="scrapy.dupefilters.BaseDupeFilter")
    assert answers == [True] * 3
    assert dropped == [] and written == ["https://shop.test/a"] * 3


def test_another_dupefilter_is_asked_first_then_the_fleet_wide_dedup(
    redis_url: str, namespace: str
) -> None:
    DropMarked.logged = []
    urls = [("https://shop.test/b?drop", False), ("https://shop.test/b?drop", True),
            ("https://shop.test/a", False), ("https://shop.test/a", False)]
    dropped, answers, written = run(
        redis_url, namespace, lambda rig: _yield(rig, urls),
        DUPEFILTER_CLASS=f"{__name__}.DropMarked")
    # The first refused here (the engine sends request_dropped for a refused request), the
    # last one found a duplicate fleet-wide: both logged by the project's dupefilter.
    assert answers == [False, True, True, True]
    assert dropped == ["https://shop.test/a"]
    assert DropMarked.logged == ["https://shop.test/b?drop", "https://shop.test/a"]
    assert sorted(written) == ["https://shop.test/a", "https://shop.test/b?drop"]


def test_scrapy_redis_dupefilter_is_refused_naming_the_setting() -> None:
    crawler = get_crawler(ShopSpider, settings_dict={
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter"})
    with pytest.raises(ConfigError, match=r"^DUPEFILTER_CLASS: scrapy_redis\."):
        Duplicates(crawler, ShopSpider())

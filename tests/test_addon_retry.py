"""Retries with the add-on: Scrapy's in-memory RetryMiddleware is off by its place in
DOWNLOADER_MIDDLEWARES (not by RETRY_ENABLED), the durable retries take its role and honour
RETRY_ENABLED as Scrapy's would. No Redis: the decision needs none."""

from __future__ import annotations

from typing import Any

from scrapy import Request, Spider
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.http import Response
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.test import get_crawler
from twisted.internet.error import ConnectionLost

from meteorseed_scrapy.middlewares import BackoffMiddleware
from tests.test_retry_scrapy import attempt, middleware

ADDON = "meteorseed_scrapy.addon.MeteorSeedAddon"


def downloader_middlewares(**settings: Any) -> dict[type, int | None]:
    crawler = get_crawler(Spider, settings_dict={"ADDONS": {ADDON: 0}, **settings})
    listed = crawler.settings.getwithbase("DOWNLOADER_MIDDLEWARES")
    return {load_object(path): order for path, order in listed.items()}


def built(crawler: Any) -> list[type]:
    """The downloader middlewares Scrapy would build, in order."""
    listed = build_component_list(crawler.settings.getwithbase("DOWNLOADER_MIDDLEWARES"))
    return [load_object(path) for path in listed]


def test_scrapys_retry_middleware_is_off_by_its_place_and_retry_settings_keep_their_value(
) -> None:
    crawler = get_crawler(Spider, settings_dict={"ADDONS": {ADDON: 0}})
    assert crawler.settings.getbool("RETRY_ENABLED")
    assert crawler.settings.getpriority("RETRY_ENABLED") == 0  # Scrapy's default, untouched
    middlewares = downloader_middlewares()
    assert middlewares[RetryMiddleware] is None
    assert middlewares[BackoffMiddleware] is not None
    # What Scrapy builds from it (on Scrapy 2.14 a class key did not override the base's path
    # key, and its retries stayed on under ours).
    assert RetryMiddleware not in built(crawler) and BackoffMiddleware in built(crawler)


def test_a_project_that_lists_scrapys_retry_middleware_keeps_it() -> None:
    mine = {"DOWNLOADER_MIDDLEWARES": {RetryMiddleware: 551}}
    assert downloader_middlewares(**mine)[RetryMiddleware] == 551
    assert RetryMiddleware in built(get_crawler(Spider, settings_dict={"ADDONS": {ADDON: 0},
                                                                       **mine}))


def test_scrapys_retry_middleware_built_by_hand_works_under_the_addon() -> None:
    # What Scrapy's tests/test_downloadermiddleware_retry.py does (and a project may).
    crawler = get_crawler(Spider, settings_dict={"ADDONS": {ADDON: 0}})
    crawler.spider = crawler._create_spider("retry")
    mw = build_from_crawler(RetryMiddleware, crawler)
    request = Request("http://www.scrapytest.org/503")
    again = mw.process_response(request, Response(request.url, status=503))
    assert isinstance(again, Request)
    assert again.meta["retry_times"] == 1


def test_retry_enabled_false_means_no_durable_retry() -> None:
    mw = middleware(RETRY_ENABLED=False)
    assert not attempt(mw, "http://www.scrapytest.org/503", 0, 503)
    assert not attempt(mw, "http://www.scrapytest.org/x", 0, ConnectionLost("foo"))
    assert mw.stats.get_value("retry/count") is None
    # and on (Scrapy's default), the same failures are retried
    assert attempt(middleware(), "http://www.scrapytest.org/503", 0, 503)

"""scrapy_internals: every private part of Scrapy the project uses is there on the installed
Scrapy (this test fails, naming it, on one that lacks it), the installed Scrapy is within the
checked range, and nothing else in the package reaches into Scrapy's privates."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import scrapy
from packaging.version import Version
from scrapy import Request, Spider
from scrapy.core.engine import ExecutionEngine
from scrapy.core.scraper import Scraper
from scrapy.crawler import Crawler
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.http import TextResponse
from scrapy.utils.test import get_crawler
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.web._newclient import HTTP11ClientProtocol
from twisted.web._newclient import Request as TxRequest
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from meteorseed_scrapy import scrapy_internals
from meteorseed_scrapy.scrapy_internals import (
    CHECKED_ON,
    TWISTED_CHECKED_ON,
    ScraperPatch,
    check,
    count_head_lines,
    is_default_callback,
    missing,
    parse_robots,
    robots_error,
    robots_parsers,
)
from tests import internals_helpers
from tests.internals_helpers import assert_in_checked_range, setup_cfg_floor

PACKAGE = Path(scrapy_internals.__file__).parent


class _Spider(Spider):
    name = "internals"


def crawler(spidercls: type[Spider] = _Spider, settings: dict[str, Any] | None = None
            ) -> Crawler:
    """Scrapy's ``get_crawler`` (on a Scrapy with no reactorless mode, conftest installed the
    asyncio reactor first)."""
    return get_crawler(spidercls, settings)


def _engine() -> ExecutionEngine:
    async def build() -> ExecutionEngine:  # (download handlers want a running loop)
        # (no download handler: none is used, and an unused one leaves a session open)
        built = crawler(settings={"DOWNLOAD_HANDLERS": {"http": None, "https": None}})
        built.spider = built._create_spider()
        built.engine = ExecutionEngine(built, lambda _: None)
        return built.engine

    return asyncio.run(build())


def test_every_private_part_used_is_in_the_installed_scrapy() -> None:
    assert missing(_engine()) == [], (
        f"Scrapy {scrapy.__version__} lacks private parts meteorseed_scrapy uses: "
        "see meteorseed_scrapy/scrapy_internals.py")
    check(_engine())


@pytest.mark.parametrize(("name", "checked"), [("Scrapy", CHECKED_ON),
                                               ("Twisted", TWISTED_CHECKED_ON)])
def test_the_installed_release_is_in_the_checked_range(name: str, checked: tuple[str, str]
                                                       ) -> None:
    assert_in_checked_range(name, checked, "scrapy_internals.py")


def test_the_checked_floor_is_setup_cfgs() -> None:
    assert setup_cfg_floor("scrapy") == Version(CHECKED_ON[0])


def test_the_default_callback_is_the_spiders_parse_its_override_included() -> None:
    from scrapy.spiders import CrawlSpider

    class Crawl(CrawlSpider):
        name = "crawl"

    spider, crawl = _Spider(), Crawl()
    assert is_default_callback(spider, spider._parse)
    assert is_default_callback(crawl, crawl._parse)  # (CrawlSpider's own _parse)
    assert not is_default_callback(spider, crawl._parse)
    assert not is_default_callback(spider, spider.parse)
    assert not is_default_callback(spider, None)


def test_a_scrapy_lacking_a_part_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(Scraper, "_process_spidermw_output_async")
    monkeypatch.delattr(Spider, "_set_crawler")
    assert missing() == ["Scraper._process_spidermw_output_async", "Spider._set_crawler"]
    with pytest.raises(RuntimeError, match=r"Scraper\._process_spidermw_output_async, "
                       r"Spider\._set_crawler of Scrapy and Twisted \(checked on Scrapy "
                       r"2\.14\.0 to 2\.19\.0, Twisted 25\.5\.0 to "):
        check()


def test_an_engine_lacking_an_attribute_is_named() -> None:
    engine = _engine()
    del engine._start
    del engine.downloader.active
    assert missing(engine) == ["engine._start", "downloader.active"]


def test_a_scraper_without_enqueue_scrape_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine()
    monkeypatch.delattr(Scraper, "enqueue_scrape")
    with pytest.raises(RuntimeError, match=r"needs Scraper\.enqueue_scrape"):
        ScraperPatch(engine.crawler)


def test_the_scraper_patch_is_put_back() -> None:
    engine = _engine()
    scraper = engine.scraper
    patch = ScraperPatch(engine.crawler)
    assert patch.counting

    async def replacement(*args: object) -> None:
        return None

    patch.install(replacement, replacement, replacement)
    assert scraper.enqueue_scrape is replacement
    assert scraper._process_spidermw_output_async is replacement
    patch.restore()
    assert scraper.enqueue_scrape == patch.enqueue_scrape
    assert scraper.handle_spider_output_async == patch.handle_output
    assert scraper._process_spidermw_output_async == patch.process_output


#: A private attribute of Scrapy's engine, scraper, downloader or crawler, or of its Spider class,
#: read or set outside scrapy_internals (the project's own private names are its business).
SPIDER_PRIVATE = sorted(n for n in dir(Spider) if n.startswith("_") and not n.startswith("__"))
PRIVATE = re.compile(r"\b_?(engine|scraper|downloader|crawler)\._[a-z]\w*|"
                     rf"\b_?spider\.({'|'.join(SPIDER_PRIVATE)})\b|"
                     r"\.(_pool|_factory|_parsers?|_parse_robots|_robots_error)\b|"
                     r"\b(scrapy|twisted)(\.\w+)*\._[a-z]\w*|"
                     r"[\"'](_slot|_start|_set_crawler|_process_spidermw_output_async|_pool|"
                     r"_factory|_parsers?|_parse_robots|_robots_error|_parse)[\"']")


def offenders(package: Path) -> list[str]:
    return internals_helpers.offenders(package, PRIVATE, "scrapy_internals.py")


def test_no_other_module_touches_scrapys_privates() -> None:
    assert offenders(PACKAGE) == []


def test_the_offenders_pattern_sees_the_head_caps_privates(tmp_path: Path) -> None:
    assert internals_helpers.flagged(offenders, tmp_path, (
        "from twisted.web._newclient import HTTPClientParser\n"
        "pool = getattr(handler, '_pool')\n"
        "handler._pool._factory = factory  # a comment's _pool is no touch\n"
        "parser = protocol._parser\n"
        "self._stats = stats  # (a name of one's own)\n"
        "await super()._parse_robots(response, netloc, request)\n")) == [1, 2, 3, 4, 6]


def test_a_twisted_lacking_a_part_of_the_connection_pool_fails_loudly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(HTTPConnectionPool, "_factory")
    monkeypatch.delattr(HTTP11ClientProtocol, "_parser")
    assert missing() == ["HTTPConnectionPool._factory", "HTTP11ClientProtocol._parser"]
    with pytest.raises(RuntimeError, match=r"needs HTTPConnectionPool\._factory, "
                       r"HTTP11ClientProtocol\._parser of Scrapy and Twisted"):
        check()


def _get(persistent: bool = False) -> TxRequest:
    return TxRequest(b"GET", b"/", Headers({b"host": [b"loopback"]}), None, persistent)


class _Handler:
    """An HTTP11DownloadHandler as far as count_head_lines looks."""

    def __init__(self) -> None:
        self._pool = HTTPConnectionPool(reactor=None)  # (never connects)


def test_a_handler_without_its_pool_is_refused_naming_it() -> None:
    handler = _Handler()
    del handler._pool
    with pytest.raises(RuntimeError, match=r"needs HTTP11DownloadHandler\._pool\._factory of "):
        count_head_lines(handler, lambda: print)  # type: ignore[arg-type]


def test_a_handlers_connections_report_each_line_of_a_responses_head() -> None:
    """Through a protocol the pool's factory builds, as a connection gets it: each request's
    head lines are reported as they arrive, to that request's own counter, never the body's."""
    handler = _Handler()
    heads: list[list[int]] = []

    def new_head() -> Callable[[int], None]:
        heads.append([])
        return heads[-1].append

    count_head_lines(handler, new_head)  # type: ignore[arg-type]
    factory = handler._pool._factory(lambda protocol: None, "loopback")
    protocol = factory.buildProtocol(None)
    protocol.makeConnection(StringTransport())
    for _ in range(2):  # (a persistent connection: a parser of its own per request)
        protocol.request(_get(persistent=True))
        protocol.dataReceived(b"HTTP/1.1 200 OK\r\nX-One: 1\r\nContent-Length: 4\r\n\r\n"
                              b"a\r\nb")
    assert heads == [[16, 9, 18, 1], [16, 9, 18, 1]]  # (each with its \r)


def test_a_head_counter_that_raises_drops_the_connection() -> None:
    handler = _Handler()

    def new_head() -> Callable[[int], None]:
        def line(length: int) -> None:
            raise ValueError("over")
        return line

    count_head_lines(handler, new_head)  # type: ignore[arg-type]
    factory = handler._pool._factory(lambda protocol: None, "loopback")
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    answer = protocol.request(_get())
    failures: list[Any] = []
    answer.addErrback(failures.append)
    protocol.dataReceived(b"HTTP/1.1 200 OK\r\n")
    assert transport.disconnecting
    protocol.connectionLost(Failure(ConnectionDone()))
    assert failures and "over" in repr(failures[0].value.reasons)


def test_a_root_handler_hook_runs_once_and_switches_itself_off() -> None:
    from scrapy.exceptions import NotConfigured

    from meteorseed_scrapy.scrapy_internals import RootHandlerHook

    seen = []

    class Hook(RootHandlerHook):
        @classmethod
        def on_root_handler(cls, crawler: object) -> None:
            seen.append(crawler)

    built = crawler()
    with pytest.raises(NotConfigured):
        Hook.from_crawler(built)
    assert seen == [built]


# -- robots.txt: Scrapy's parse (async with the request in 2.19, plain in 2.14) and error --------
def _robots_middleware() -> RobotsTxtMiddleware:
    return RobotsTxtMiddleware(crawler(settings={"ROBOTSTXT_OBEY": True}))


def test_scrapys_parse_and_error_settle_a_hosts_robots_txt() -> None:
    middleware = _robots_middleware()
    parsers = robots_parsers(middleware)
    waiting: list[object] = []
    for host in ("a.example", "b.example"):
        parsers[host] = Deferred()
        parsers[host].addCallback(waiting.append)
    body = b"User-agent: *\nDisallow: /private\n"
    asyncio.run(parse_robots(middleware, TextResponse("http://a.example/robots.txt", body=body),
                             "a.example", Request("http://a.example/x")))
    robots_error(middleware, ValueError("unreadable"), "b.example")
    parser = parsers["a.example"]
    assert waiting == [parser, None] and parsers["b.example"] is None
    assert not parser.allowed("http://a.example/private", "*")
    assert parser.allowed("http://a.example/public", "*")


def test_a_plain_parse_without_the_request_is_called_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """As Scrapy 2.14's ``_parse_robots(response, netloc)``, not a coroutine."""
    called: list[tuple[object, ...]] = []

    def parse(self: object, response: object, netloc: str) -> None:
        called.append((self, response, netloc))

    monkeypatch.setattr(RobotsTxtMiddleware, "_parse_robots", parse)
    middleware = _robots_middleware()
    response = TextResponse("http://a.example/robots.txt", body=b"")
    asyncio.run(parse_robots(middleware, response, "a.example", Request("http://a.example/")))
    assert called == [(middleware, response, "a.example")]


def test_a_scrapy_lacking_a_robots_part_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    middleware = _robots_middleware()
    del middleware._parsers
    with pytest.raises(RuntimeError, match=r"needs RobotsTxtMiddleware\._parsers of "):
        robots_parsers(middleware)
    monkeypatch.delattr(RobotsTxtMiddleware, "_robots_error")
    assert missing() == ["RobotsTxtMiddleware._robots_error"]

"""Every use of a private (or undocumented) part of Scrapy or Twisted, behind one door.

Checked on Scrapy :data:`CHECKED_ON` (the floor in ``setup.cfg`` to the newest release tried)
and Twisted :data:`TWISTED_CHECKED_ON`, by reading each one's source and by
``tests/test_scrapy_internals.py``, which fails, naming the missing part, on a release that
lacks one. A worker crawl checks them too when it opens
(:func:`check`): an error then, rather than tasks that are never acked.

What is used, and why:

* ``Scraper.enqueue_scrape`` (wrapped): its Deferred fires once per final hop after every item
  passed the pipelines, the only such moment; while it runs, the task's scrape is current.
* ``Scraper.handle_spider_output_async`` and ``Scraper._process_spidermw_output_async``
  (wrapped): a callback's output counted where it starts and where each one is through, so a
  task settles as soon as its output is (optional: without them, the Deferred above ends it).
* ``ExecutionEngine._slot.nextcall`` (scheduled): wakes the engine when work came, instead of
  waiting for its 5 s heartbeat; ``_slot.close_if_idle``: the shell opens a spider by hand.
* ``ExecutionEngine._start`` (replaced): start requests paced by the stream's reads.
* ``Downloader.active``: downloads in progress, for the worker's work budget.
* ``Spider._set_crawler``: a spider built by its own ``from_crawler`` without ``super()``'s;
  ``Spider._parse``: the callback Scrapy's scraper calls for a request without one
  (:func:`is_default_callback`: a request's callback stored as none).
* ``HTTP11DownloadHandler._pool._factory`` and Twisted's ``HTTP11ClientProtocol._parser``
  (an ``HTTPClientParser``, Scrapy's lenient one included): the head lines of each response
  counted as they arrive (:func:`count_head_lines`, for :mod:`meteorseed_scrapy.header_cap`).
* ``RobotsTxtMiddleware._parsers``, ``_parse_robots`` and ``_robots_error``: Scrapy's parse
  and error record of a robots.txt the project's middleware fetched its own way
  (:mod:`meteorseed_scrapy.politeness.robotstxt`; :func:`parse_robots`).
* Build order: ``Crawler.crawl`` replaces the root log handler (``_update_root_log_handler``)
  before the engine builds its eager download handlers, then its first downloader middleware,
  where :class:`RootHandlerHook` runs, before any crawling (no signal marks that moment).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import scrapy
import scrapy.core.engine
import twisted
from scrapy import Spider
from scrapy.core.downloader import Downloader
from scrapy.core.engine import ExecutionEngine
from scrapy.core.scraper import Scraper
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
    from scrapy.crawler import Crawler
    from scrapy.http import Response

#: The Scrapy releases every use below was checked on: setup.cfg's floor, the newest tried.
CHECKED_ON = ("2.14.0", "2.19.0")
#: The Twisted releases the download handler's connections were checked on (with Scrapy's floor
#: and newest: what they install).
TWISTED_CHECKED_ON = ("25.5.0", "26.10.0")

_REQUIRED_METHODS = (
    (Scraper, "enqueue_scrape"),
    (Scraper, "handle_spider_output_async"),
    (Scraper, "_process_spidermw_output_async"),
    (Spider, "_set_crawler"),
    (Spider, "_parse"),
    (ExecutionEngine, "needs_backout"),
    (RobotsTxtMiddleware, "_parse_robots"),
    (RobotsTxtMiddleware, "_robots_error"),
)
_REQUIRED_ATTRIBUTES = (  # set on the instance by its __init__
    ("engine", "_slot"), ("engine", "_start"), ("downloader", "active"), ("scraper", "slot"),
)


def missing(engine: ExecutionEngine | None = None) -> list[str]:
    """The private parts of Scrapy this project uses that the installed Scrapy lacks; the
    instance attributes are looked for on ``engine`` (a built engine) when given."""
    gone = [f"{cls.__name__}.{name}" for cls, name in _REQUIRED_METHODS
            if not callable(getattr(cls, name, None))]
    slot = getattr(scrapy.core.engine, "_Slot", None)
    params = inspect.signature(slot.__init__).parameters if slot is not None else {}
    gone += [f"engine._slot.{name}" for name in ("nextcall", "close_if_idle")
             if name not in params]
    if engine is not None:
        owners = {"engine": engine, "downloader": getattr(engine, "downloader", None),
                  "scraper": getattr(engine, "scraper", None)}
        gone += [f"{owner}.{name}" for owner, name in _REQUIRED_ATTRIBUTES
                 if not hasattr(owners[owner], name)]
    # (imported here: Twisted's HTTP client is ~50 ms a worker's commands need not pay)
    from twisted.web._newclient import HTTP11ClientProtocol, HTTPClientParser
    from twisted.web.client import HTTPConnectionPool

    return gone + [f"{cls.__name__}.{name}" for cls, name in (
        (HTTPConnectionPool, "_factory"), (HTTP11ClientProtocol, "_parser"),
        (HTTP11ClientProtocol, "request"), (HTTPClientParser, "lineReceived"))
        if not hasattr(cls, name)]


def check(engine: ExecutionEngine | None = None) -> None:
    """Raise, naming what is missing, when the installed Scrapy (or Twisted) lacks a part
    used here."""
    _refuse(missing(engine))


def _refuse(gone: list[str]) -> None:
    if gone:
        raise RuntimeError(
            f"meteorseed_scrapy needs {', '.join(gone)} of Scrapy and Twisted (checked on "
            f"Scrapy {CHECKED_ON[0]} to {CHECKED_ON[1]}, Twisted {TWISTED_CHECKED_ON[0]} to "
            f"{TWISTED_CHECKED_ON[1]}); Scrapy {scrapy.__version__} with Twisted "
            f"{twisted.__version__} lacks {'it' if len(gone) == 1 else 'them'}")


# -- the scraper ---------------------------------------------------------------------------------
class ScraperPatch:
    """Three methods of one crawler's scraper, replaced on the instance and put back."""

    def __init__(self, crawler: Crawler) -> None:
        self._scraper: Scraper = crawler.engine.scraper
        enqueue = getattr(self._scraper, "enqueue_scrape", None)
        if not callable(enqueue):
            check()
            raise RuntimeError("Scrapy's scraper has no enqueue_scrape")
        self.enqueue_scrape: Callable[..., Any] = enqueue
        handle = getattr(self._scraper, "handle_spider_output_async", None)
        process = getattr(self._scraper, "_process_spidermw_output_async", None)
        # (both or neither: the output is counted where it starts and where it is through)
        self.counting = callable(handle) and callable(process)
        self.handle_output: Callable[..., Any] = handle if callable(handle) else _absent
        self.process_output: Callable[..., Any] = process if callable(process) else _absent
        self._installed = False

    def install(self, enqueue_scrape: Callable[..., Any], handle_output: Callable[..., Any],
                process_output: Callable[..., Any]) -> None:
        self._set(enqueue_scrape, handle_output, process_output)
        self._installed = True

    def restore(self) -> None:
        if self._installed:
            self._set(self.enqueue_scrape, self.handle_output, self.process_output)
            self._installed = False

    def _set(self, enqueue_scrape: Callable[..., Any], handle_output: Callable[..., Any],
             process_output: Callable[..., Any]) -> None:
        scraper: Any = self._scraper
        scraper.enqueue_scrape = enqueue_scrape
        if self.counting:
            scraper.handle_spider_output_async = handle_output
            scraper._process_spidermw_output_async = process_output


def _absent(*args: Any) -> Any:
    raise RuntimeError("not in this Scrapy: never installed")


# -- the engine ----------------------------------------------------------------------------------
def wake_engine(engine: ExecutionEngine | None) -> None:
    """Have the engine ask the scheduler for requests on its next turn. Not before its
    scraper's slot exists: ``needs_backout`` asserts it (it is set late in ``open_spider``)."""
    slot = getattr(engine, "_slot", None)
    if slot is not None and getattr(engine and engine.scraper, "slot", None) is not None:
        slot.nextcall.schedule()


def opened_by_hand(crawler: Crawler) -> bool:
    """Whether the spider was opened without ``Crawler.crawl`` and not to close when idle:
    how Scrapy's shell opens it. Known once the engine opened the spider."""
    slot = getattr(getattr(crawler, "engine", None), "_slot", None)
    return getattr(crawler, "crawling", True) is False \
        and getattr(slot, "close_if_idle", True) is False


def start_iterator(engine: ExecutionEngine) -> AsyncIterator[Any] | None:
    """The engine's iterator over the spider's ``start()`` (None: no such thing here)."""
    start = getattr(engine, "_start", None)
    return start if isinstance(start, AsyncIterator) else None


def replace_start_iterator(engine: ExecutionEngine, start: AsyncIterator[Any]) -> None:
    engine._start = start


def downloads_in_progress(crawler: Crawler) -> int:
    """Downloads in progress in ``crawler``'s engine."""
    downloader: Downloader | None = crawler.engine.downloader
    return len(downloader.active) if downloader is not None else 0


# -- the HTTP/1.1 download handler's connections ------------------------------------------------
def count_head_lines(handler: HTTP11DownloadHandler,
                     new_head: Callable[[], Callable[[int], object]]) -> None:
    """Have ``handler``'s connections report each response's head as it arrives: for each
    request sent, ``new_head()`` gives the function then called with the length of every line
    of its response's head (status, header and continuation lines; Twisted's parser reads the
    body raw), which may raise to drop the connection there."""
    pool: Any = getattr(handler, "_pool", None)
    factory = getattr(pool, "_factory", None)
    if not isinstance(factory, type):
        _refuse(["HTTP11DownloadHandler._pool._factory", *missing()])
    pool._factory = _head_counting_factory(factory, new_head)


def _head_counting_factory(factory_class: Any, new_head: Callable[[], Callable[[int], object]]
                           ) -> Any:
    """The pool's protocol factory whose protocols swap in a counting parser per request."""

    def buildProtocol(self: Any, addr: Any) -> Any:
        protocol = factory_class.buildProtocol(self, addr)
        send = protocol.request

        def request(tx_request: Any) -> Any:
            sent = send(tx_request)
            parser = protocol._parser  # (made by request(); no byte of the answer read yet)
            if parser is not None:
                parser.__class__ = _head_counting(parser.__class__)
                parser.meteorseed_head_line = new_head()
            return sent

        protocol.request = request
        return protocol

    return type(f"HeadCounting{factory_class.__name__}", (factory_class,),
                {"buildProtocol": buildProtocol})


@cache
def _head_counting(parser_class: Any) -> Any:
    """``parser_class`` reporting the length of each line it receives."""

    def lineReceived(self: Any, line: bytes) -> None:
        self.meteorseed_head_line(len(line))
        parser_class.lineReceived(self, line)

    return type(f"HeadCounting{parser_class.__name__}", (parser_class,),
                {"lineReceived": lineReceived})


# -- robots.txt ----------------------------------------------------------------------------------
def robots_parsers(middleware: RobotsTxtMiddleware) -> dict[str, Any]:
    """The middleware's robots.txt per host: its parser, None (none could be read) or the
    Deferred of one being fetched; :func:`parse_robots` and :func:`robots_error` settle it."""
    parsers = getattr(middleware, "_parsers", None)
    if not isinstance(parsers, dict):
        _refuse(["RobotsTxtMiddleware._parsers"])
    return parsers  # type: ignore[return-value]


async def parse_robots(middleware: RobotsTxtMiddleware, response: Response, netloc: str,
                       request: Request) -> None:
    """Scrapy's parse of ``response`` (``netloc``'s robots.txt, fetched for ``request``) into
    the middleware's parser for ``netloc``."""
    parse: Any = RobotsTxtMiddleware._parse_robots
    if inspect.iscoroutinefunction(parse):
        await parse(middleware, response, netloc, request)
    else:
        parse(middleware, response, netloc)


def robots_error(middleware: RobotsTxtMiddleware, error: Exception, netloc: str) -> None:
    """Scrapy's record of ``netloc``'s robots.txt that could not be read (its stats; every
    waiter gets None: nothing disallowed)."""
    RobotsTxtMiddleware._robots_error(middleware, error, netloc)


# -- the log handler ------------------------------------------------------------------------------
class RootHandlerHook:
    """A downloader middleware at order 0 that is no middleware at all: built right after Scrapy
    replaced the root log handler, it runs :meth:`on_root_handler` and switches itself off
    (``NotConfigured``, silently), so it costs nothing per request."""

    @classmethod
    def on_root_handler(cls, crawler: Crawler) -> None:
        raise NotImplementedError

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RootHandlerHook:
        cls.on_root_handler(crawler)
        raise NotConfigured


# -- the spider ----------------------------------------------------------------------------------
def attach_crawler(spider: Spider, crawler: Crawler) -> None:
    """What ``Spider.from_crawler`` does besides building: ``spider.crawler``, its settings,
    ``close`` on ``spider_closed``."""
    spider._set_crawler(crawler)


def is_default_callback(spider: Spider | None, func: object) -> bool:
    """Whether ``func`` is ``spider``'s default callback (``_parse``, its own override
    included), which Scrapy's scraper calls for a request that has none."""
    return getattr(func, "__self__", None) is spider and getattr(func, "__name__", None) == "_parse"


__all__ = ["CHECKED_ON", "TWISTED_CHECKED_ON", "RootHandlerHook", "ScraperPatch", "attach_crawler",
           "check", "count_head_lines", "downloads_in_progress", "is_default_callback", "missing",
           "opened_by_hand", "parse_robots", "replace_start_iterator", "robots_error",
           "robots_parsers", "start_iterator", "wake_engine"]

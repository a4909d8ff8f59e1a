"""A cap on a response's header section, where Twisted parses it.

Twisted's HTTP client takes any number of header lines: a response of 300,000 of them (9 MB)
held the event loop 10.7 s while Scrapy's HTTP/1.1 handler parsed them, and the worker's RSS
grew with them (docs/robustness.md). :class:`HeaderCapDownloadHandler` is Scrapy's
``HTTP11DownloadHandler`` whose connections count the lines of a response's head (the status
line, header lines, continuation lines) and their bytes as they arrive; past
``METEORSEED_MAX_RESPONSE_HEADERS`` lines or ``METEORSEED_RESPONSE_HEADERS_MAXSIZE`` bytes the
connection is closed there and the download fails with :class:`ResponseHeadersOverCap` (an
``IgnoreRequest``: its task ends ``ignored``, the reason naming the cap in its completion record,
as a response over ``DOWNLOAD_MAXSIZE`` does), one warning and
``meteorseed/responses/headers_over_cap``. 0 switches a cap off.

The add-on makes it the ``http`` and ``https`` handler unless the project set a handler for that
scheme itself (``DOWNLOAD_HANDLERS``: then the project's, and no cap; scrapy-playwright's
handler is one). Proxies and HTTPS tunnels use the same connection pool, so they are capped too.

The lines are counted through private parts of Scrapy and Twisted, all behind
:func:`meteorseed_scrapy.scrapy_internals.count_head_lines`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy import Request
from scrapy.core.downloader.handlers.http11 import HTTP11DownloadHandler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.settings import BaseSettings

from meteorseed_scrapy.scrapy_internals import count_head_lines
from meteorseed_scrapy.settings import integer_setting

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

LINES_SETTING = "METEORSEED_MAX_RESPONSE_HEADERS"
SIZE_SETTING = "METEORSEED_RESPONSE_HEADERS_MAXSIZE"
STAT = "meteorseed/responses/headers_over_cap"
HANDLER = "meteorseed_scrapy.header_cap.HeaderCapDownloadHandler"


class ResponseHeadersOverCap(IgnoreRequest):
    """A response's head went over a cap: its connection was closed there."""


@dataclass(frozen=True)
class HeaderCaps:
    lines: int  # 0: no cap
    size: int

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> HeaderCaps:
        return cls(integer_setting(settings, LINES_SETTING, minimum=0),
                   integer_setting(settings, SIZE_SETTING, minimum=0))


class _HeadCount:
    """One response's head so far; raises once it is over a cap."""

    __slots__ = ("caps", "lines", "size")

    def __init__(self, caps: HeaderCaps) -> None:
        self.caps = caps
        self.lines = 0
        self.size = 0

    def line(self, length: int) -> None:
        self.lines += 1
        self.size += length + 1  # (its line break)
        caps = self.caps
        if caps.lines and self.lines > caps.lines:
            raise ResponseHeadersOverCap(
                f"response headers over {LINES_SETTING} ({caps.lines} lines)")
        if caps.size and self.size > caps.size:
            raise ResponseHeadersOverCap(
                f"response headers over {SIZE_SETTING} ({caps.size} bytes)")


class HeaderCapDownloadHandler(HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 handler with the response head capped (see the module's doc)."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self.stats = crawler.stats  # (a name of its own: not Scrapy's)
        caps = HeaderCaps.from_settings(crawler.settings)
        if caps.lines or caps.size:
            count_head_lines(self, lambda: _HeadCount(caps).line)

    async def download_request(self, request: Request) -> Response:
        try:
            return await super().download_request(request)
        except Exception as exc:
            over = _over_cap(exc)
            if over is None:
                raise
            self.stats.inc_value(STAT)
            logger.warning("Download of %s abandoned: %s", request.url, over)
            raise ResponseHeadersOverCap(str(over)) from exc


def _over_cap(error: BaseException) -> ResponseHeadersOverCap | None:
    """The cap error behind ``error`` (Twisted wraps it in ``ResponseFailed``'s reasons, Scrapy
    in ``DownloadFailedError``), if any."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        one = todo.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        if isinstance(one, ResponseHeadersOverCap):
            return one
        todo += [r.value for r in getattr(one, "reasons", ()) if hasattr(r, "value")]
        todo += [e for e in (one.__cause__, one.__context__) if e is not None]
    return None


def set_handlers(settings: BaseSettings) -> None:
    """The capped handler for ``http`` and ``https``, at the add-on's priority: a scheme the
    project (or ``-s``, or a spider's ``custom_settings``) gave a handler of its own keeps it,
    ``None`` included (Scrapy keeps a dict setting's keys with their priorities)."""
    handlers = settings["DOWNLOAD_HANDLERS"]
    if not isinstance(handlers, BaseSettings):  # (a plain BaseSettings: a dict, or None)
        handlers = BaseSettings(handlers or {}, priority="project")
        settings.set("DOWNLOAD_HANDLERS", handlers, priority="project")
    for scheme in ("http", "https"):
        handlers.set(scheme, HANDLER, priority="addon")


__all__ = ["HANDLER", "HeaderCapDownloadHandler", "HeaderCaps", "ResponseHeadersOverCap",
           "set_handlers"]

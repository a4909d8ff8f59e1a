"""The download handler of ``render: browser`` sites: scrapy-playwright's, one browser per worker.

Its own module so that scrapy-playwright and Playwright are imported only by a worker that
installs this handler (:func:`meteorseed_scrapy.sites.render.configure`), not by every module
that merely knows about rendering.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals

from meteorseed_scrapy.sites.render import (
    RenderUnavailable,
    chromium_path,
    launch_args,
    remote_browser,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

_OWNERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

#: scrapy-playwright releases whose private parts below were read and tried (the floor in
#: ``setup.cfg`` to the newest): its handler launches Playwright at the engine's start, and a
#: worker whose tasks never render must not start a browser.
PLAYWRIGHT_CHECKED_ON = ("0.0.46", "0.0.48")
#: The module's flag that says which engine signal starts the browser.
PRIVATE_FLAG = "_SCRAPY_ASYNC_API"
#: The handler's methods used or overridden here.
PRIVATE_METHODS = ("_maybe_launch_in_thread", "_engine_started", "_download_request", "_launch")

try:
    from scrapy_playwright import handler as _pw
except ImportError:  # the `playwright` extra is not installed
    _pw = None


def missing(module: Any) -> list[str]:
    """The private parts of scrapy-playwright's ``handler`` module used here that ``module``
    lacks (none: this handler works with it)."""
    lacking = [] if hasattr(module, PRIVATE_FLAG) else [PRIVATE_FLAG]
    handler = getattr(module, "ScrapyPlaywrightDownloadHandler", None)
    return lacking + [f"ScrapyPlaywrightDownloadHandler.{name}" for name in PRIVATE_METHODS
                      if not callable(getattr(handler, name, None))]


def check(module: Any) -> None:
    """:class:`RenderUnavailable` naming what ``module`` lacks, with the releases tried."""
    lacking = missing(module)
    if lacking:
        raise RenderUnavailable(
            f"this scrapy-playwright lacks {', '.join(lacking)}, which the browser handler "
            f"uses (tried on scrapy-playwright {PLAYWRIGHT_CHECKED_ON[0]} to "
            f"{PLAYWRIGHT_CHECKED_ON[1]}): install one of those")

if _pw is not None:

    class BrowserHandler(_pw.ScrapyPlaywrightDownloadHandler):
        """scrapy-playwright's handler; Playwright starts at the first rendered request."""

        def __init__(self, crawler: Crawler) -> None:
            check(_pw)
            super().__init__(crawler)
            started = (self._maybe_launch_in_thread if _pw._SCRAPY_ASYNC_API
                       else self._engine_started)
            crawler.signals.disconnect(started, signals.engine_started)
            # Scrapy builds one handler per scheme: https renders through the http one's
            # browser, so the page and context caps hold per worker, with one browser.
            self.owner: BrowserHandler = _OWNERS.setdefault(crawler, self)
            if not remote_browser(crawler.settings):
                options = self.config.launch_options
                options["executable_path"] = chromium_path(crawler.settings)
                options.setdefault("headless", True)
                options["args"] = launch_args(options.get("args", ()))
            self._start_lock = asyncio.Lock()
            self.started = False

        async def _download_request(self, request: Request, spider: Spider | None = None) -> Any:
            if self.owner is not self:
                return await self.owner._download_request(request, spider)
            if not self.started:
                async with self._start_lock:
                    if not self.started:
                        await self._launch()
                        self.started = True
            return await super()._download_request(request, spider)

else:  # pragma: no cover - exercised only without the extra

    class BrowserHandler:  # type: ignore[no-redef]
        def __init__(self, crawler: Crawler) -> None:
            raise RenderUnavailable("scrapy-playwright is not installed: pip install"
                                    " 'meteorseed-scrapy[playwright]'")

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

try:
    from scrapy_playwright import handler as _pw
except ImportError:  # the `playwright` extra is not installed
    _pw = None

if _pw is not None:

    class BrowserHandler(_pw.ScrapyPlaywrightDownloadHandler):
        """scrapy-playwright's handler; Playwright starts at the first rendered request."""

        def __init__(self, crawler: Crawler) -> None:
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

"""Makes Scrapy's ``Scraper.enqueue_scrape`` fail, as a Scrapy bug or a closing scraper would,
for responses whose URL has ``scrapefault`` in its query: ``PROBE_SCRAPE_FAULT = "sync"``
raises at once, ``"deferred"`` returns a Deferred that fails a moment later; the scrape never
runs.

Patched on the class when the crawler is built, so the worker wraps the faulty method as it
would wrap Scrapy's own.
"""

from __future__ import annotations

from typing import Any

from scrapy.core.scraper import Scraper
from scrapy.exceptions import NotConfigured
from twisted.internet.task import deferLater


class ScrapeFault:
    @classmethod
    def from_crawler(cls, crawler: Any) -> ScrapeFault:
        mode = crawler.settings.get("PROBE_SCRAPE_FAULT")
        if not mode:
            raise NotConfigured
        original = Scraper.enqueue_scrape

        def enqueue_scrape(self: Scraper, result: Any, request: Any) -> Any:
            if "scrapefault" not in request.url:
                return original(self, result, request)
            if mode == "sync":
                raise RuntimeError("scraper fault")
            from twisted.internet import reactor  # (here: importing it installs a reactor)

            return deferLater(reactor, 0.01, _fault)

        Scraper.enqueue_scrape = enqueue_scrape  # type: ignore[method-assign]
        return cls()


def _fault() -> None:
    raise RuntimeError("scraper fault, later")

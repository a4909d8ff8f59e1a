"""A worker whose store is gone stops, leaving its tasks pending.

An outage that outlasts ``METEORSEED_STORE_RETRY_MAX`` (full disk, read-only file, lost
connection, refused credentials), or a store lost outright (its SQLite file deleted or replaced),
makes the store stage give up the items it holds: their tasks are not acked. Taking more tasks
would fail each of them the same way, and every failure uses up a delivery until the task is
dead-lettered, although nothing is wrong with it. So the worker stops at once: one error line,
the stat ``meteorseed/store/outage_stop``, the spider closed with reason
:data:`REASON`, and ``scrapy crawl`` exits 1. Its tasks stay pending (unstarted ones are handed
back, their delivery not counted) for a worker whose store works, or for this one once restarted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from scrapy import signals

from meteorseed_scrapy.store.base import StoreLost, StoreUnavailable

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

REASON = "meteorseed_store_unavailable"


class OutageStop:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.cause: StoreUnavailable | None = None
        self._closing: asyncio.Future[None] | None = None
        crawler.signals.connect(self._engine_stopped, signals.engine_stopped)

    def __call__(self, exc: StoreUnavailable) -> None:
        if self.cause is not None:
            return
        self.cause = exc
        logger.error(
            "Store %s: stopping this worker; its tasks stay pending (none acked, none"
            " dead-lettered) until a worker with a working store takes them: %s",
            "lost" if isinstance(exc, StoreLost) else "unavailable", exc)
        if self.crawler.stats is not None:
            self.crawler.stats.set_value("meteorseed/store/outage_stop", 1)
        engine = self.crawler.engine
        if engine is not None and engine.spider is not None:
            self._closing = asyncio.ensure_future(engine.close_spider_async(reason=REASON))

    def _engine_stopped(self) -> None:
        if self.cause is not None:
            # Scrapy's crawl command exits 1 only for a crawl that did not start, which it
            # tells by the crawler having no spider: the one way to make this stop non-zero.
            self.crawler.spider = None


__all__ = ["REASON", "OutageStop"]

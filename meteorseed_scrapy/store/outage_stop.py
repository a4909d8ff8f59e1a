"""A worker that cannot go on safely stops, leaving its tasks pending.

:class:`CrawlStop` closes the spider with a reason and makes ``scrapy crawl`` exit 1, after one
error line and a stat. :class:`OutageStop` is the store stage's: an outage that outlasts
``METEORSEED_STORE_RETRY_MAX`` (full disk, read-only file, lost connection, refused credentials),
or a store lost outright (its SQLite file deleted or replaced), makes the store stage give up the
items it holds: their tasks are not acked. Taking more tasks would fail each of them the same
way, and every failure uses up a delivery until the task is dead-lettered, although nothing is
wrong with it. So the worker stops at once (reason :data:`REASON`, stat
``meteorseed/store/outage_stop``). Its tasks stay pending (unstarted ones are handed back, their
delivery not counted) for a worker whose store works, or for this one once restarted.
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


class CrawlStop:
    """Stops the crawl once, for good: ``stop(message)`` logs ``message`` as an error, sets the
    stat ``stat`` to 1 and closes the spider with ``reason``; ``scrapy crawl`` exits 1, or
    ``exit_code`` when one is given (the process exits with it once the engine stopped)."""

    def __init__(self, crawler: Crawler, reason: str, stat: str,
                 log: logging.Logger = logger, exit_code: int | None = None) -> None:
        self.crawler = crawler
        self.reason = reason
        self.stat = stat
        self._log = log
        self._exit_code = exit_code
        self.stopped = False
        self._closing: asyncio.Future[None] | None = None
        # weak=False: the owner (a watchdog whose loop has ended) may be gone by then.
        crawler.signals.connect(self._engine_stopped, signals.engine_stopped, weak=False)

    def stop(self, message: str) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._log.error("%s", message)
        if self.crawler.stats is not None:
            self.crawler.stats.set_value(self.stat, 1)
        try:
            engine = self.crawler.engine
        except RuntimeError:  # (no crawl running: nothing to close)
            return
        if engine.spider is not None:
            self._closing = asyncio.ensure_future(engine.close_spider_async(reason=self.reason))

    def _engine_stopped(self) -> None:
        if self.stopped and self._exit_code is not None:
            asyncio.get_running_loop().call_soon(_exit, self._exit_code)
        elif self.stopped:
            # Scrapy's crawl command exits 1 only for a crawl that did not start, which it
            # tells by the crawler having no spider: the one way to make this stop non-zero.
            self.crawler.spider = None


def _exit(code: int) -> None:
    raise SystemExit(code)


class OutageStop:
    def __init__(self, crawler: Crawler) -> None:
        self._stop = CrawlStop(crawler, REASON, "meteorseed/store/outage_stop")

    def stopping(self) -> bool:
        """Whether the crawl is being stopped (SIGTERM, SIGINT, ``crawler.stop()``): the store
        stage then gives up waiting on an outage (its tasks stay pending)."""
        try:
            engine = self._stop.crawler.engine
        except RuntimeError:  # (no crawl running)
            return False
        return engine is not None and engine.spider is not None and not engine.running

    def __call__(self, exc: StoreUnavailable) -> None:
        self._stop.stop(
            f"Store {'lost' if isinstance(exc, StoreLost) else 'unavailable'}: stopping this"
            " worker; its tasks stay pending (none acked, none dead-lettered) until a worker"
            f" with a working store takes them: {exc}")


__all__ = ["REASON", "CrawlStop", "OutageStop"]

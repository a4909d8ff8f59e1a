"""StreamScheduler: Scrapy's scheduler slot, fed from a Redis Stream consumer group.

A thin face: a worker crawl is assembled by :class:`~meteorseed_scrapy.worker.crawl.WorkerCrawl`
from the crawl's runtime (:class:`~meteorseed_scrapy.politeness.runtime.CrawlRuntime`, shared
with the middlewares), and its tasks belong to its
:class:`~meteorseed_scrapy.worker.pump.StreamPump`. ``next_request()`` takes what the pump has
ready in memory (its background loops do the I/O). A task is acked only after its final hop was
scraped, every item it produced was committed, and every request it yielded is durable in the
stream.

Requests that are no task of the stream (:mod:`~meteorseed_scrapy.task.local_crawl` says
which) go to Scrapy's own scheduler, built from the crawler as Scrapy builds it: the whole crawl
of ``scrapy fetch``, ``view``, ``parse``, ``check``, ``bench`` and ``shell``, which then never
connects to Redis; in a worker crawl, an ``engine.crawl()`` from outside any scrape and what
descends from it. ``next_request()`` hands those out first: they are few, and someone is
usually waiting for them (the shell).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from scrapy import Request, Spider, signals
from scrapy.core.scheduler import Scheduler
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet.defer import Deferred

from meteorseed_scrapy.politeness.policy import SiteLimits
from meteorseed_scrapy.politeness.runtime import CrawlRuntime
from meteorseed_scrapy.scrapy_internals import wake_engine
from meteorseed_scrapy.task.context import current_scrape, task_of
from meteorseed_scrapy.task.local_crawl import local_crawl, local_request, log_local_crawl
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.crawl import WorkerCrawl, WorkerSettings
from meteorseed_scrapy.worker.pump import StreamPump

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)
_REFUSED = "Invalid setting, the crawl cannot start: %s"


class StreamScheduler:
    def __init__(self, crawler: Crawler, runtime: CrawlRuntime, settings: WorkerSettings) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.runtime = runtime
        self.settings = settings
        self.pump: StreamPump | None = None  # a worker crawl's (None: a local crawl)
        self._worker: WorkerCrawl | None = None
        self._local = Scheduler.from_crawler(crawler)  # requests that are no task
        self._local_waiting: Counter[int] = Counter()  # the local requests' priorities

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> StreamScheduler:
        try:
            return cls(crawler, CrawlRuntime.of(crawler),
                       WorkerSettings.from_settings(crawler.settings))
        except ConfigError as exc:
            # Scrapy 2.19 then fails closing the engine ("Engine slot not assigned", fixed by
            # scrapy#8169), which buries this error in the traceback: name the setting first.
            logger.error(_REFUSED, exc)
            raise

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        await _maybe(self._local.open(spider))
        reason = local_crawl(self.crawler)
        if reason is not None:
            log_local_crawl(reason)
            return
        try:
            self._worker = await WorkerCrawl.open(self.crawler, spider, self.settings, self._wake)
        except Exception as exc:
            # Refused (store or shard count of another worker, a Scrapy it cannot work with, a
            # setting): ``scrapy crawl`` must exit 1. Scrapy 2.14's CrawlerProcess tells a crawl
            # that did not start only by its crawler having no spider (a later one also by the
            # start raising); the engine closes the spider it holds itself.
            if isinstance(exc, ConfigError):
                logger.error(_REFUSED, exc)  # (named first, as above)
            self.crawler.spider = None
            raise
        self.pump = self._worker.pump
        self.crawler.signals.connect(self._on_idle, signals.spider_idle)

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        await _maybe(self._local.close(reason))
        if self._worker is not None:
            await self._worker.close()
            logger.info("StreamScheduler closed (%s)", reason)

    def limits_for(self, site_id: str) -> SiteLimits:
        """The settings' defaults, overridden by the site's rule config (hot-reloaded)."""
        return self.runtime.limits_for(site_id)

    # -- the engine's side -------------------------------------------------------------------
    def has_pending_requests(self) -> bool:
        return self._local.has_pending_requests() or (
            self.pump is not None and self.pump.has_work())

    def next_request(self) -> Request | None:
        # Local requests first (someone waits for them), unless the stream holds one of higher
        # priority for this worker: by priority, as Scrapy's scheduler serves them.
        pump = self.pump
        if pump is not None and self._local_waiting \
                and pump.ahead_of(max(self._local_waiting)):
            return pump.next_request()
        request = self._local.next_request()
        if request is not None:
            self._local_waiting[request.priority] -= 1
            if self._local_waiting[request.priority] <= 0:
                del self._local_waiting[request.priority]
        elif pump is not None:
            request = pump.next_request()
        return request

    def enqueue_request(self, request: Request) -> bool:
        scrape = current_scrape()
        if self.pump is None or local_request(request, scrape):
            queued = self._local.enqueue_request(request)
            if queued:
                self._local_waiting[request.priority] += 1
            return queued
        task = task_of(request)
        # A request of a task held here, unless that task's own callback yielded it, is a retry
        # or redirect of it: the same task, kept local.
        if task is not None and (scrape is None or scrape.task.task_id != task.task_id) \
                and self.pump.hop(request):
            return True
        return self.pump.child(scrape, request)

    def _wake(self) -> None:
        wake_engine(self.crawler.engine)

    def _on_idle(self, spider: Spider) -> None:
        idle_close = self.runtime.config.idle_close
        quiet_for = self.pump.quiet_for() if self.pump is not None else None
        if idle_close and quiet_for is not None and quiet_for >= idle_close:
            logger.info("Nothing left in namespace %r for %.1fs: closing",
                        self.runtime.keys.namespace, quiet_for)
            return
        raise DontCloseSpider


async def _maybe(result: Deferred[None] | None) -> None:
    if result is not None:  # Scrapy's scheduler returns its dupefilter's open/close result
        await maybe_deferred_to_future(result)


__all__ = ["StreamScheduler"]

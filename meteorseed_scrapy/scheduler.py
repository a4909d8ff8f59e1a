"""StreamScheduler: Scrapy's scheduler slot, fed from a Redis Stream consumer group.

The worker's tasks belong to :class:`~meteorseed_scrapy.worker.pump.StreamPump`; this class
wires it into Scrapy's engine. ``next_request()`` takes what the pump has ready in memory (its
background loops do the I/O); :class:`~meteorseed_scrapy.worker.scrapes.ScrapeTracker` tells it
which scrape works for which task and when it is over. A task is acked only after its final hop
was scraped, every item it produced was committed, and every request it yielded is durable in
the stream.

Requests that are no task of the stream (:mod:`~meteorseed_scrapy.task.local_crawl` says
which) go to Scrapy's own scheduler, built from the crawler as Scrapy builds it: the whole crawl
of ``scrapy fetch``, ``view``, ``parse``, ``check``, ``bench`` and ``shell``, which then never
connects to Redis; in a worker crawl, an ``engine.crawl()`` from outside any scrape and what
descends from it. ``next_request()`` hands those out first: they are few, and someone is
usually waiting for them (the shell).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.core.scheduler import Scheduler
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from twisted.internet.defer import Deferred

from meteorseed_scrapy.middlewares import BackoffMiddleware, CircuitBreakerMiddleware
from meteorseed_scrapy.politeness.adaptive import AdaptiveThrottleMiddleware
from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.politeness.gate import SiteGate, lease_ttl
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.politeness.robotstxt import RobotsTxtMiddleware
from meteorseed_scrapy.politeness.site_limits import SiteLimitsLookup
from meteorseed_scrapy.queue.connection import async_client
from meteorseed_scrapy.queue.consumer import StreamConsumer
from meteorseed_scrapy.queue.dedup import project_fingerprinter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.lanes import LaneWeights
from meteorseed_scrapy.queue.retention import DeadLetterRetention, housekeeping
from meteorseed_scrapy.queue.shards import check_shard_count
from meteorseed_scrapy.queue.spiders import worker_spider
from meteorseed_scrapy.queue.writer import TaskWriter
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.yields import YieldReporter
from meteorseed_scrapy.settings import WorkerConfig, duration_setting, flag_setting
from meteorseed_scrapy.sites.lookup import site_configs
from meteorseed_scrapy.store.identity import check_store_identity
from meteorseed_scrapy.task.context import current_scrape, task_of
from meteorseed_scrapy.task.local_crawl import local_crawl, local_request, log_local_crawl
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.interpreter import InterpreterTuning
from meteorseed_scrapy.worker.loops import REDIS_DOWN
from meteorseed_scrapy.worker.pump import StreamPump
from meteorseed_scrapy.worker.redis_watchdog import RedisWatchdog
from meteorseed_scrapy.worker.scrapes import ScrapeTracker
from meteorseed_scrapy.worker.work_budget import WorkSizes

logger = logging.getLogger(__name__)


class StreamScheduler:
    def __init__(self, crawler: Any, config: WorkerConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.keys = KeyLayout.for_config(config)
        self.stats = crawler.stats
        settings = crawler.settings
        self.interpreter = InterpreterTuning.from_settings(settings)
        self.politeness = flag_setting(settings, "METEORSEED_POLITENESS")
        self.sizes = WorkSizes.from_settings(settings)
        self._site_limits = SiteLimitsLookup(SiteLimits.from_settings(settings),
                                             site_configs(crawler))
        self.backoff = Backoff.from_settings(settings)
        self.breaker_config = BreakerConfig.from_settings(settings)
        self.retention = DeadLetterRetention.from_settings(settings)
        self.prune_idle = duration_setting(settings, "METEORSEED_CONSUMER_PRUNE_IDLE")
        self.lane_weights = LaneWeights.from_settings(settings)
        self.redis: Any = None
        self.pump: StreamPump | None = None
        self._scrapes: ScrapeTracker | None = None
        self._chores: list[asyncio.Future[None]] = []  # housekeeping, seed yield reports
        self._yields: YieldReporter | None = None
        self._local: Scheduler | None = None  # requests that are no task: Scrapy's own queue
        self._local_waiting: Counter[int] = Counter()  # the local requests' priorities
        self._worker = False  # a worker crawl (the stream's tasks), not a local one

    @classmethod
    def from_crawler(cls, crawler: Any) -> StreamScheduler:
        try:
            return cls(crawler, WorkerConfig.from_settings(crawler.settings))
        except ConfigError as exc:
            # Scrapy 2.19 then fails closing the engine ("Engine slot not assigned", fixed by
            # scrapy#8169), which buries this error in the traceback: name the setting first.
            logger.error("Invalid setting, the crawl cannot start: %s", exc)
            raise

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self, spider: Spider) -> Deferred[None]:
        return deferred_from_coro(self._open(spider))

    async def _open(self, spider: Spider) -> None:
        self._local = Scheduler.from_crawler(self.crawler)
        await _maybe(self._local.open(spider))
        reason = local_crawl(self.crawler)
        if reason is not None:
            log_local_crawl(reason)
            return
        self._worker = True
        own = worker_spider(spider.name)  # its task set, besides tasks that name no spider
        if own is not None:
            self.keys = self.keys.with_spiders([own])
        scrapes = ScrapeTracker(self.crawler)  # (refuses a Scrapy it cannot work with)
        self.redis = async_client(
            self.config.redis_url, decode_responses=True, socket_timeout=10,
            socket_connect_timeout=5, health_check_interval=15,
        )
        try:  # another shard count would look for every site's tasks in the wrong shard
            await check_shard_count(self.redis, self.keys)
            await check_store_identity(self.redis, self.keys, self.crawler.settings)
        except REDIS_DOWN as exc:  # the pump waits for Redis and checks again
            logger.warning("Cannot check the namespace's shard count yet: %s", exc)
        consumer = StreamConsumer(self.redis, self.keys, self.config.consumer, self.lane_weights,
                                  spider=own)
        gate = SiteGate(self.redis, self.keys, self.limits_for, self.config.consumer, self.backoff,
                        self.breaker_config.probe_interval,
                        lease_ttl_s=lease_ttl(self.config.claim_idle))
        breaker = Breaker(self.redis, self.keys, self.breaker_config, self.stats,
                          lambda site: self.limits_for(site).quota(site))
        for mw_class in (BackoffMiddleware, CircuitBreakerMiddleware, AdaptiveThrottleMiddleware,
                         RobotsTxtMiddleware):
            mw = self.crawler.get_downloader_middleware(mw_class)
            if mw is not None:
                mw.bind(gate, breaker)
        new_urls: Counter[str] = Counter()  # seed_id -> new child URLs, until reported
        # Child requests are deduplicated by the project's REQUEST_FINGERPRINTER_CLASS if set.
        writer = TaskWriter(self.redis, self.keys,
                            fingerprinter=project_fingerprinter(self.crawler))
        self.pump = StreamPump(
            self.crawler, spider, consumer, writer, self.config,
            gate=gate, breaker=breaker, limits_for=self.limits_for, sizes=self.sizes,
            politeness=self.politeness, on_change=self._wake, on_new_urls=new_urls.update,
        )
        self._scrapes = scrapes
        scrapes.install(self.pump)
        self.crawler.signals.connect(self._on_idle, signals.spider_idle)
        self.crawler.signals.connect(self._on_opened, signals.spider_opened)
        logger.info(
            "StreamScheduler reading %s (%d shard(s), lanes %s) as consumer %r of group %r "
            "(Redis %s)", self.keys.shard_keys[0].stream, self.keys.shards, self.lane_weights,
            self.config.consumer, self.keys.group, redact(self.config.redis_url),
        )
        if own is not None:
            logger.info("Spider %r takes its own tasks (seeds naming \"spider\": %r, and their "
                        "children) and those that name no spider", own, own)
        self.pump.start()
        self._yields = YieldReporter(SeedRegistry(self.redis, self.keys), new_urls)
        self._chores = [
            asyncio.ensure_future(housekeeping(
                self.retention, consumer.membership(),
                self.prune_idle, self.stats)),
            asyncio.ensure_future(self._yields.run()),
            asyncio.ensure_future(RedisWatchdog(self.crawler, self.redis, self.config.redis_url,
                                                self.config.idle_close).run()),
        ]

    def _on_opened(self, spider: Spider) -> None:
        self.interpreter.started()

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        if self._local is not None:
            await _maybe(self._local.close(reason))
        if not self._worker:
            return
        for task in self._chores:
            await _cancelled(task)
        if self.pump is not None:
            await self.pump.stop()
        if self._yields is not None:
            await self._yields.close()
        if self._scrapes is not None:
            self._scrapes.uninstall()
        if self.redis is not None:
            await self.redis.aclose()
        self.interpreter.stopped()
        logger.info("StreamScheduler closed (%s)", reason)

    def limits_for(self, site_id: str) -> SiteLimits:
        """The settings' defaults, overridden by the site's rule config (hot-reloaded)."""
        return self._site_limits(site_id)

    # -- the engine's side -------------------------------------------------------------------
    def has_pending_requests(self) -> bool:
        return (self._local is not None and self._local.has_pending_requests()) or (
            self.pump is not None and self.pump.has_work())

    def next_request(self) -> Request | None:
        # Local requests first (someone waits for them), unless the stream holds one of higher
        # priority for this worker: by priority, as Scrapy's scheduler serves them.
        pump, local = self.pump, self._local
        if pump is not None and self._local_waiting \
                and pump.ahead_of(max(self._local_waiting)):
            return pump.next_request()
        request = local.next_request() if local is not None else None
        if request is not None:
            self._local_waiting[request.priority] -= 1
            if self._local_waiting[request.priority] <= 0:
                del self._local_waiting[request.priority]
        elif pump is not None:
            request = pump.next_request()
        return request

    def enqueue_request(self, request: Request) -> bool:
        assert self._local is not None
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
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None)
        if slot is not None and getattr(engine.scraper, "slot", None) is not None:
            slot.nextcall.schedule()

    def _on_idle(self, spider: Spider) -> None:
        idle_close = self.config.idle_close
        quiet_for = self.pump.quiet_for() if self.pump is not None else None
        if idle_close and quiet_for is not None and quiet_for >= idle_close:
            logger.info("Nothing left in namespace %r for %.1fs: closing",
                        self.keys.namespace, quiet_for)
            return
        raise DontCloseSpider


async def _maybe(result: Deferred[None] | None) -> None:
    if result is not None:  # Scrapy's scheduler returns its dupefilter's open/close result
        await maybe_deferred_to_future(result)


async def _cancelled(task: asyncio.Future[None]) -> None:
    """Cancel ``task`` and wait for its end: again while it runs on, since a cancellation that
    lands inside a redis-py command can be swallowed there (the chore then went back to its
    sleep and the close waited for ever)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()


__all__ = ["StreamScheduler"]

"""StreamScheduler: Scrapy's scheduler slot, fed from a Redis Stream consumer group.

``next_request()`` only pops a local buffer that :class:`~meteorseed_scrapy.worker.pump.StreamPump`
fills in the background. A task is acked only after its final hop was scraped, every item it
produced passed the store stage (which awaits its commit), and every request it yielded is
durable in the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import statistics
import time
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.exceptions import DontCloseSpider
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from meteorseed_scrapy.middlewares import BackoffMiddleware, CircuitBreakerMiddleware
from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.politeness.site_limits import SiteLimitsLookup
from meteorseed_scrapy.queue.connection import async_client
from meteorseed_scrapy.queue.consumer import StreamConsumer
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.lanes import LaneWeights
from meteorseed_scrapy.queue.retention import DeadLetterRetention, housekeeping
from meteorseed_scrapy.queue.shards import check_shard_count
from meteorseed_scrapy.queue.writer import TaskWriter
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.yields import YieldReporter
from meteorseed_scrapy.settings import (
    ConfigError,
    WorkerConfig,
    duration_setting,
    flag_setting,
    setting,
    to_integer,
)
from meteorseed_scrapy.sites.lookup import site_configs
from meteorseed_scrapy.task.context import (
    CURRENT_SCRAPE,
    LEASE_META_KEY,
    TASK_META_KEY,
    Scrape,
    current_scrape,
    task_of,
)
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.worker.ledger import Entry, Outcome, TaskLedger
from meteorseed_scrapy.worker.outcomes import judge
from meteorseed_scrapy.worker.pump import REDIS_DOWN, StreamPump
from meteorseed_scrapy.worker.requests import request_to_task, task_to_request
from meteorseed_scrapy.worker.work_budget import WorkBudget

logger = logging.getLogger(__name__)


class StreamScheduler:
    def __init__(self, crawler: Any, config: WorkerConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.keys = KeyLayout.for_config(config)
        self.stats = crawler.stats
        settings = crawler.settings
        self.capacity = settings.getint("CONCURRENT_REQUESTS")
        self.prefetch = max(1, self.capacity // 2)
        settling = setting(settings, "METEORSEED_MAX_SETTLING")  # None: the capacity
        self.max_settling = max(2, self.capacity if settling is None else to_integer(
            settling, "METEORSEED_MAX_SETTLING", minimum=1))
        self._blocked = False  # next_request() refused for max_settling: wake the engine later
        self.freeze_gc = flag_setting(settings, "METEORSEED_FREEZE_GC")
        self.ledger = TaskLedger()
        self.work = WorkBudget(crawler, self.ledger, self.capacity, self.prefetch)
        self.politeness = flag_setting(settings, "METEORSEED_POLITENESS")
        self.limits = SiteLimits.from_settings(settings)
        self.site_configs = site_configs(crawler)
        self._site_limits = SiteLimitsLookup(self.limits, self.site_configs)
        self.backoff = Backoff.from_settings(settings)
        self.breaker_config = BreakerConfig.from_settings(settings)
        self.retention = DeadLetterRetention.from_settings(settings)
        self.prune_idle = duration_setting(settings, "METEORSEED_CONSUMER_PRUNE_IDLE")
        self._chores: asyncio.Future[None] | None = None
        self._yields: YieldReporter | None = None
        self._yield_task: asyncio.Future[None] | None = None
        self.lane_weights = LaneWeights.from_settings(settings)
        self.spider: Spider | None = None
        self.redis: Any = None
        self.pump: StreamPump | None = None
        self._orig_enqueue_scrape: Any = None

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
        self.spider = spider
        scraper = self.crawler.engine.scraper
        if not callable(getattr(scraper, "enqueue_scrape", None)):
            raise RuntimeError(
                "StreamScheduler needs Scraper.enqueue_scrape (Scrapy 2.13-2.19); "
                "this Scrapy version does not have it"
            )
        self._orig_enqueue_scrape = scraper.enqueue_scrape
        scraper.enqueue_scrape = self._enqueue_scrape
        self.redis = async_client(
            self.config.redis_url, decode_responses=True, socket_timeout=10,
            socket_connect_timeout=5, health_check_interval=15,
        )
        try:  # another shard count would look for every site's tasks in the wrong shard
            await check_shard_count(self.redis, self.keys)
        except REDIS_DOWN as exc:  # the pump waits for Redis and checks again
            logger.warning("Cannot check the namespace's shard count yet: %s", exc)
        consumer = StreamConsumer(self.redis, self.keys, self.config.consumer, self.lane_weights)
        gate = SiteGate(self.redis, self.keys, self.limits_for, self.config.consumer, self.backoff,
                        self.breaker_config.probe_interval)
        breaker = Breaker(self.redis, self.keys, self.breaker_config, self.stats,
                          lambda site: self.limits_for(site).quota(site))
        self.pump = StreamPump(
            consumer, TaskWriter(self.redis, self.keys), self.ledger, self.config, self.stats,
            gate=gate, breaker=breaker, limits_for=self.limits_for if self.politeness else None,
            want=self.work.want, budget=self._budget, on_change=self._wake,
        )
        self.pump.read_batch = max(1, self.capacity // 4)
        for mw_class in (BackoffMiddleware, CircuitBreakerMiddleware):
            mw = self.crawler.get_downloader_middleware(mw_class)
            if mw is not None:
                mw.bind(gate, breaker)
        sig = self.crawler.signals
        sig.connect(self._on_idle, signals.spider_idle)
        sig.connect(self._on_item_error, signals.item_error)
        sig.connect(self._on_spider_error, signals.spider_error)
        sig.connect(self._on_opened, signals.spider_opened)
        logger.info(
            "StreamScheduler reading %s (%d shard(s), lanes %s) as consumer %r of group %r "
            "(Redis %s)", self.keys.shard_keys[0].stream, self.keys.shards, self.lane_weights,
            self.config.consumer, self.keys.group, redact(self.config.redis_url),
        )
        self.pump.start()
        self._chores = asyncio.ensure_future(
            housekeeping(self.retention, consumer, self.prune_idle, self.stats))
        self._yields = YieldReporter(SeedRegistry(self.redis, self.keys), self.pump.child_yield)
        self._yield_task = asyncio.ensure_future(self._yields.run())

    def _on_opened(self, spider: Spider) -> None:
        if self.freeze_gc:
            # Long-lived start-up objects out of the collector's way: measured as the main
            # cost of a busy worker (see the design notes).
            gc.collect()
            gc.freeze()

    def close(self, reason: str) -> Deferred[None]:
        return deferred_from_coro(self._close(reason))

    async def _close(self, reason: str) -> None:
        for task in (self._chores, self._yield_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.pump is not None:
            await self.pump.stop()
            with contextlib.suppress(Exception):  # (Redis away: the consumer stays listed)
                await self.pump.consumer.leave()
            _record_ack_latency(self.stats, list(self.pump.latencies_ms))
        if self._yields is not None:
            await self._yields.close()
        if self._orig_enqueue_scrape is not None:
            self.crawler.engine.scraper.enqueue_scrape = self._orig_enqueue_scrape
        if self.redis is not None:
            await self.redis.aclose()
        logger.info("StreamScheduler closed (%s)", reason)

    def limits_for(self, site_id: str) -> SiteLimits:
        """The settings' defaults, overridden by the site's rule config (hot-reloaded)."""
        return self._site_limits(site_id)

    # -- the engine's side -------------------------------------------------------------------
    def has_pending_requests(self) -> bool:
        pump = self.pump
        return bool(pump and (pump.hops or pump.buffer or pump.outbox))

    def next_request(self) -> Request | None:
        pump = self.pump
        if pump is None or pump.stopping:
            return None
        if self.work.settling() >= self.max_settling:
            # Responses already waiting for the scraper and the store are enough to keep both
            # busy; more would only wait in line, adding to every task's response-to-ack time.
            self._blocked = True
            return None
        desk = pump.desk
        if desk is not None:
            sites = list(desk.ready_sites())
        else:
            sites = pump.hops.sites() + pump.buffer.sites()
        for site in sites:
            request = pump.hops.pop(site) or self._next_task_request(site)
            if request is None:
                continue
            if desk is not None:
                request.meta[LEASE_META_KEY] = desk.take(site)
            return request
        return None

    def _next_task_request(self, site: str) -> Request | None:
        pump = self.pump
        assert pump is not None
        while True:
            entry: Entry | None = pump.buffer.pop(site)
            if entry is None:
                return None
            if self.ledger.get(entry.task.task_id) is not entry:
                continue  # taken over by another worker meanwhile
            try:
                request = task_to_request(entry.task, self.spider)
            except TaskError as exc:
                self.ledger.finish_scrape(entry.task.task_id, Outcome.DEAD, f"bad task: {exc}")
                pump.settle(entry)
                continue
            timeout = self.limits_for(site).timeout
            if timeout is not None:
                request.meta.setdefault("download_timeout", timeout)
            entry.started = True
            pump.room()
            self.stats.inc_value("meteorseed/started")
            return request

    def _download_finished(self, request: Request) -> None:
        """The download that carried ``request``'s lease is over: give the lease back."""
        pump = self.pump
        lease = request.meta.pop(LEASE_META_KEY, None)
        if pump is not None and pump.desk is not None and lease:
            pump.desk.done(lease)
            pump.want_permits()

    def enqueue_request(self, request: Request) -> bool:
        task = task_of(request)
        scrape = current_scrape()
        if task is not None and task.task_id in self.ledger and not (
            scrape is not None and scrape.task.task_id == task.task_id
        ):
            # A redirect of a task we hold: the same task, kept local, dispatched with a permit.
            self._download_finished(request)
            assert self.pump is not None
            self.pump.hops.append(task.site_id, request)
            self.pump.want_permits()
            return True
        parent = scrape.task if scrape is not None else None
        try:
            child = request_to_task(request, self.spider, parent)
            child.to_message()  # size check now, where the error can name the request
        except TaskError as exc:
            logger.error("Cannot make a task of %s: %s", request, exc)
            self.stats.inc_value("meteorseed/children/rejected")
            if scrape is not None:
                scrape.fail(f"yielded request {request.url}: {exc}")
            return False
        assert self.pump is not None
        if parent is not None:
            self.ledger.child_added(parent.task_id)
        parent_id = parent.task_id if parent else None
        self.pump.outbox.append((child, parent_id, not request.dont_filter))
        self.pump.kick()
        return True

    def _budget(self) -> int:
        return self.work.permits(self.pump.desk if self.pump is not None else None)

    def _wake(self) -> None:
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None)
        if slot is not None and getattr(engine.scraper, "slot", None) is not None:
            slot.nextcall.schedule()

    # -- knowing when a task is finished -----------------------------------------------------
    def _enqueue_scrape(self, result: Response | Failure, request: Request) -> Deferred[Any]:
        task = task_of(request)
        self._download_finished(request)
        entry = self.ledger.get(task.task_id) if task is not None else None
        if entry is None:
            return self._orig_enqueue_scrape(result, request)
        entry.scrape = Scrape(entry.task)
        entry.response_at = time.monotonic()
        token = CURRENT_SCRAPE.set(entry.scrape)
        try:
            dfd = self._orig_enqueue_scrape(result, request)
        finally:
            CURRENT_SCRAPE.reset(token)
        dfd.addBoth(self._scrape_finished, entry, result, request)
        return dfd

    def _scrape_finished(self, passthrough: Any, entry: Entry, result: Response | Failure,
                         request: Request) -> Any:
        outcome, reason = judge(entry, result, request, self.spider, self.crawler.settings,
                                self.stats)
        settled = self.ledger.finish_scrape(entry.task.task_id, outcome, reason)
        if settled is not None and self.pump is not None:
            self.pump.settle(settled)
        if self._blocked:  # a scrape finished: next_request() may hand out work again
            self._blocked = False
            self._wake()
        return passthrough

    def _on_item_error(self, item: Any, response: Any, spider: Spider, failure: Failure) -> None:
        _fail_scrape("item not committed", failure)

    def _on_spider_error(self, failure: Failure, response: Any, spider: Spider) -> None:
        _fail_scrape("callback error", failure)

    def _on_idle(self, spider: Spider) -> None:
        pump = self.pump
        idle_close = self.config.idle_close
        if pump is not None and idle_close and pump.quiet_since is not None:
            quiet_for = time.monotonic() - pump.quiet_since
            if quiet_for >= idle_close:
                logger.info("Nothing left in namespace %r for %.1fs: closing",
                            self.keys.namespace, quiet_for)
                return
        raise DontCloseSpider


def _record_ack_latency(stats: Any, samples: list[float]) -> None:
    if samples:
        cuts = statistics.quantiles(samples, n=20) if len(samples) > 1 else samples * 19
        stats.set_value("meteorseed/ack_latency_ms/p50", round(statistics.median(samples), 1))
        stats.set_value("meteorseed/ack_latency_ms/p95", round(cuts[18], 1))


def _fail_scrape(what: str, failure: Failure) -> None:
    """Mark the scrape in progress (if any) failed: its task is not acked."""
    scrape = current_scrape()
    if scrape is not None:
        scrape.fail(f"{what}: {type(failure.value).__name__}: {failure.getErrorMessage()}")


__all__ = ["TASK_META_KEY", "StreamScheduler"]

"""A worker crawl, assembled in one place: from the crawl's runtime
(:class:`~meteorseed_scrapy.politeness.runtime.CrawlRuntime`) to the pump that owns its tasks,
the scrape tracking wrapped around Scrapy's scraper, and the chores that run beside them
(housekeeping, seed yield reports, the Redis watchdog). The scheduler only opens, closes and
asks it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy import Spider, signals

from meteorseed_scrapy.politeness.runtime import CrawlRuntime
from meteorseed_scrapy.queue.consume.retention import DeadLetterRetention, housekeeping
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN
from meteorseed_scrapy.queue.shards import check_shard_count
from meteorseed_scrapy.scrapy_internals import ScraperPatch
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.yields import YieldReporter
from meteorseed_scrapy.settings import duration_setting, flag_setting
from meteorseed_scrapy.sites.render import ASYNCIO_REACTOR
from meteorseed_scrapy.store.identity import check_store_identity
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.interpreter import InterpreterTuning
from meteorseed_scrapy.worker.pump import StreamPump
from meteorseed_scrapy.worker.redis_watchdog import RedisWatchdog
from meteorseed_scrapy.worker.scrapes import ScrapeTracker
from meteorseed_scrapy.worker.work_budget import WorkSizes

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSettings:
    """The worker's own settings beside the runtime's, read when the scheduler is built (an
    invalid one stops the crawl before it starts)."""

    sizes: WorkSizes
    interpreter: InterpreterTuning
    politeness: bool
    retention: DeadLetterRetention
    prune_idle: float

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> WorkerSettings:
        return cls(WorkSizes.from_settings(settings), InterpreterTuning.from_settings(settings),
                   flag_setting(settings, "METEORSEED_POLITENESS"),
                   DeadLetterRetention.from_settings(settings),
                   duration_setting(settings, "METEORSEED_CONSUMER_PRUNE_IDLE"))


class WorkerCrawl:
    def __init__(self, crawler: Crawler, spider: Spider, runtime: CrawlRuntime, patch: ScraperPatch,
                 config: WorkerSettings, on_change: Callable[[], None]) -> None:
        self._runtime = runtime
        self._config = config
        self._crawler = crawler
        self._new_urls: Counter[str] = Counter()  # seed_id -> new child URLs, until reported
        self.pump = StreamPump(
            crawler, spider, runtime.consumer, runtime.writer, runtime.config,
            gate=runtime.gate, delayed=runtime.delayed, breaker=runtime.breaker,
            limits_for=runtime.limits_for,
            sizes=config.sizes, politeness=config.politeness, on_change=on_change,
            on_new_urls=self._new_urls.update, full=runtime.full,
        )
        self._scrapes = ScrapeTracker(crawler, self.pump, patch)
        self._yields = YieldReporter(SeedRegistry(runtime.redis, runtime.keys), self._new_urls)
        self._chores: list[asyncio.Future[None]] = []

    @classmethod
    async def open(cls, crawler: Crawler, spider: Spider, config: WorkerSettings,
                   on_change: Callable[[], None]) -> WorkerCrawl:
        _check_event_loop(crawler)
        _check_capacity(config.sizes)
        patch = ScraperPatch(crawler)  # (refuses a Scrapy it cannot work with)
        runtime = CrawlRuntime.of(crawler)
        runtime.open_worker()
        keys = runtime.keys
        try:  # another shard count would look for every site's tasks in the wrong shard
            await check_shard_count(runtime.redis, keys)
            await check_store_identity(runtime.redis, keys, crawler.settings)
        except REDIS_DOWN as exc:  # the pump waits for Redis and checks again
            logger.warning("Cannot check the namespace's shard count yet: %s", exc)
        crawl = cls(crawler, spider, runtime, patch, config, on_change)
        crawl._start()
        return crawl

    def _start(self) -> None:
        crawler, runtime, keys = self._crawler, self._runtime, self._runtime.keys
        self._scrapes.install()
        crawler.signals.connect(self._on_opened, signals.spider_opened)
        logger.info(
            "StreamScheduler reading %s (%d shard(s), lanes %s) as consumer %r of group %r "
            "(Redis %s)", keys.shard_keys[0].stream, keys.shards, runtime.lane_weights,
            runtime.config.consumer, keys.group, redact(runtime.config.redis_url),
        )
        own = runtime.spider
        if own is not None:
            logger.info("Spider %r takes its own tasks (seeds naming \"spider\": %r, and their "
                        "children) and those that name no spider", own, own)
        self.pump.start()
        self._chores = [asyncio.ensure_future(chore) for chore in (
            housekeeping(self._config.retention, runtime.consumer.membership(),
                         self._config.prune_idle, crawler.stats),
            self._yields.run(),
            RedisWatchdog(crawler, runtime.redis, runtime.config.redis_url,
                          runtime.config.idle_close).run(),
        )]

    def _on_opened(self, spider: Spider) -> None:
        self._config.interpreter.started()

    async def close(self) -> None:
        for task in self._chores:
            await _cancelled(task)
        await self.pump.stop()
        await self._yields.close()
        self._scrapes.uninstall()
        await self._runtime.close()
        self._config.interpreter.stopped()


async def _cancelled(task: asyncio.Future[None]) -> None:
    """Cancel ``task`` and wait for its end: again while it runs on, since a cancellation that
    lands inside a redis-py command can be swallowed there (the chore then went back to its
    sleep and the close waited for ever)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()


def _check_event_loop(crawler: Crawler) -> None:
    """A worker crawl's Redis client, store and loops run on asyncio: under another Twisted
    reactor a crawl would open and never read a task. Refused, naming the setting (a local
    crawl, e.g. ``scrapy fetch``, runs on any reactor: it never gets here)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigError("TWISTED_REACTOR", (
            f"a MeteorSeed worker crawl needs asyncio, {ASYNCIO_REACTOR} (Scrapy's default), "
            f"got {crawler.settings.get('TWISTED_REACTOR')!r}")) from None


def _check_capacity(sizes: WorkSizes) -> None:
    """A worker reads and holds tasks for ``CONCURRENT_REQUESTS`` downloads: Scrapy's 0 ("no
    limit") would have it take tasks without bound from the rest of the fleet. Refused, naming
    the setting (a local crawl takes 0 as Scrapy does: it never gets here)."""
    if sizes.capacity == 0:
        raise ConfigError("CONCURRENT_REQUESTS", (
            "0 is Scrapy's \"no limit\", but a MeteorSeed worker reads and holds tasks for that "
            "many downloads: set a number (Scrapy's default is 16)"))


__all__ = ["WorkerCrawl", "WorkerSettings"]

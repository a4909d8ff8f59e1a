"""A crawl's shared parts, built once per crawler and handed to each component in its
``from_crawler``: the worker's config and key layout, the site limits, the Redis client, the
consumer, the fleet-wide gate and breaker, the task writer.

Nothing here reaches Redis when it is built. Whether the crawl is a worker crawl is known only
when the scheduler opens it (:mod:`~meteorseed_scrapy.task.local_crawl`: Scrapy's commands and
the shell are local); until :meth:`CrawlRuntime.open_worker` the components that would use Redis
let every request pass, and a local crawl never connects.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.politeness.gate import SiteGate, lease_ttl
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits, SiteLimitsLookup
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.lanes import LaneWeights
from meteorseed_scrapy.queue.enqueue.dedup import project_fingerprinter
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.spiders import worker_spider
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.sites.lookup import site_configs

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

_RUNTIMES: WeakKeyDictionary[Crawler, CrawlRuntime] = WeakKeyDictionary()


class CrawlRuntime:
    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self._crawler = crawler
        self.config = WorkerConfig.from_settings(settings)
        spider = getattr(crawler, "spider", None)
        #: The spider's own task set, read besides the default one (None: the default only).
        self.spider = worker_spider(spider.name) if spider is not None else None
        keys = KeyLayout.for_config(self.config)
        self.keys = keys.with_spiders([self.spider]) if self.spider is not None else keys
        self.lane_weights = LaneWeights.from_settings(settings)
        self.backoff = Backoff.from_settings(settings)
        self.breaker_config = BreakerConfig.from_settings(settings)
        #: The settings' defaults, overridden by the site's rule config (hot-reloaded).
        self.limits_for = SiteLimitsLookup(SiteLimits.from_settings(settings),
                                           site_configs(crawler))
        self.redis: AsyncRedis = async_client(
            self.config.redis_url, decode_responses=True, socket_timeout=10,
            socket_connect_timeout=5, health_check_interval=15,
        )
        self.consumer = StreamConsumer(self.redis, self.keys, self.config.consumer,
                                       self.lane_weights, spider=self.spider,
                                       progress_retention=self.config.progress_retention)
        self.gate = SiteGate(self.redis, self.keys, self.limits_for, self.config.consumer,
                             self.backoff, self.breaker_config.probe_interval,
                             lease_ttl_s=lease_ttl(self.config.claim_idle))
        self.delayed = DelayedSet(self.redis, self.keys)
        #: Redis refusing writes for want of memory, as every part of this worker reports it.
        self.full = RedisFull(crawler.stats)
        self.breaker = Breaker(self.redis, self.keys, self.breaker_config, crawler.stats,
                               lambda site: self.limits_for(site).quota(site), full=self.full)
        self.worker = False  # set when the scheduler opens a worker crawl

    @classmethod
    def of(cls, crawler: Crawler) -> CrawlRuntime:
        """``crawler``'s runtime, built by the first component that asks."""
        runtime = _RUNTIMES.get(crawler)
        if runtime is None:
            runtime = _RUNTIMES[crawler] = cls(crawler)
        return runtime

    @cached_property
    def writer(self) -> TaskWriter:
        # Child requests are deduplicated by the project's REQUEST_FINGERPRINTER_CLASS if set
        # (built when first needed: it logs which fingerprinter dedup uses).
        return TaskWriter(self.redis, self.keys,
                          fingerprinter=project_fingerprinter(self._crawler))

    def open_worker(self) -> None:
        """The crawl is a worker crawl: the components use Redis from now on."""
        self.worker = True

    async def close(self) -> None:
        await self.redis.aclose()


__all__ = ["CrawlRuntime"]

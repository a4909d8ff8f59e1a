"""An optional Prometheus endpoint per worker (``pip install meteorseed-scrapy[metrics]``).

Off unless ``METEORSEED_METRICS_PORT`` is set (the extension raises ``NotConfigured``): a port,
or a range like Scrapy's ``TELNETCONSOLE_PORT`` (``[9410, 9420]`` or ``"9410-9420"``: the first
free one, so several workers on one host, e.g. scrapyd jobs, each get one). Serves
``/metrics`` on ``METEORSEED_METRICS_HOST`` (default ``127.0.0.1``) from prometheus-client's
own thread; nothing it does at scrape time touches Redis or the reactor:

* counters read from Scrapy's stats when scraped (a dict copy): task outcomes
  (``meteorseed/outcome/*``), and the per-site series of
  :mod:`~meteorseed_scrapy.observability.site_series` (a bounded number of sites);
* gauges of the queue (backlog, pending, lag, pending per consumer) that a background asyncio
  task samples every ``METEORSEED_METRICS_INTERVAL`` seconds with its own Redis client;
* the ingest latency histogram (task ``created_at`` -> committed) and the breaker state per
  site, fed by the worker's signals (:mod:`meteorseed_scrapy.worker.signals`) on the reactor
  thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import re
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

from meteorseed_scrapy.observability.site_series import OTHER, SiteSeries
from meteorseed_scrapy.queue.inspect.status import QueueSampler
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import (
    DEFAULTS,
    duration_setting,
    integer_setting,
    redis_url_from,
    setting,
    text_setting,
)
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.local_crawl import command_of
from meteorseed_scrapy.validators import ConfigError, to_integer
from meteorseed_scrapy.worker.fate import COMMITTED, Outcome
from meteorseed_scrapy.worker.signals import breaker_state_changed, task_settled

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector as ScrapyStats

    from meteorseed_scrapy.politeness.breaker import BreakerState

logger = logging.getLogger(__name__)

try:
    from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - depends on the install
    CollectorRegistry = None  # type: ignore[assignment,misc]
    Collector = object  # type: ignore[assignment,misc]

PLAIN_COUNTERS = (
    ("acked", "meteorseed/acked"), ("read", "meteorseed/read"),
    ("reclaimed", "meteorseed/reclaimed"), ("dead_lettered", "meteorseed/dead"),
    ("redis_errors", "meteorseed/redis/errors"),
)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600, 4 * 3600,
                   86400, float("inf"))
SETTING = "METEORSEED_METRICS_PORT"
_RANGE = re.compile(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*")


def port_range(raw: Any) -> tuple[int, int] | None:
    """``METEORSEED_METRICS_PORT`` as ``(first, last)``, or ``None`` when off (unset or 0).

    Takes what Scrapy's ``TELNETCONSOLE_PORT`` takes (a port, ``[first, last]``, ``"first,last"``,
    JSON ``"[first, last]"``) and ``"first-last"``; anything else is a :class:`ConfigError`."""
    if raw is None or raw == 0 or (isinstance(raw, str) and raw.strip() in ("", "0")):
        return None
    parts: Any = raw
    if isinstance(raw, str):
        text = raw.strip()
        if match := _RANGE.fullmatch(text):
            parts = list(match.groups())
        elif text.startswith("["):
            try:
                parts = json.loads(text)
            except ValueError:
                raise ConfigError(SETTING, f"not a port or a port range: {raw!r}"[:200]) from None
        elif "," in text:
            parts = text.split(",")
    if not isinstance(parts, (list, tuple)):
        port = to_integer(parts, SETTING, minimum=1, maximum=65535)
        return port, port
    if len(parts) not in (1, 2):
        raise ConfigError(SETTING, f"a range is [first, last], got {len(parts)} values")
    first, last = (to_integer(part, SETTING, minimum=1, maximum=65535) for part in
                   (parts[0], parts[-1]))
    if first > last:
        raise ConfigError(SETTING, f"the range {first}-{last} is empty (first > last)")
    return first, last


class StatsCollector(Collector):
    """Turns the crawler's stats (and the per-site series) into Prometheus metrics at scrape
    time."""

    def __init__(self, stats: ScrapyStats, sites: SiteSeries) -> None:
        self.stats = stats
        self.sites = sites

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        stats = dict(self.stats.get_stats())
        outcomes = CounterMetricFamily("meteorseed_tasks", "Settled tasks by outcome",
                                       labels=["outcome"])
        for outcome in Outcome:
            key = f"meteorseed/outcome/{outcome.value}"
            outcomes.add_metric([outcome.value], stats.get(key, 0))
        yield outcomes
        for name, key in PLAIN_COUNTERS:
            yield CounterMetricFamily(f"meteorseed_{name}", f"Stat {key}", value=stats.get(key, 0))
        for kind, name, doc, labels, values in self.sites.families():
            family: Metric = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                f"meteorseed_{name}", doc, labels=labels)
            for label_values, value in values.items():
                family.add_metric(list(label_values), value)  # type: ignore[attr-defined]
            yield family


class MetricsExtension:
    def __init__(self, crawler: Crawler, host: str, ports: tuple[int, int], interval: float,
                 site_limit: int = DEFAULTS["METEORSEED_METRICS_SITES"]) -> None:
        if CollectorRegistry is None:
            raise NotConfigured("METEORSEED_METRICS_PORT needs prometheus-client "
                                "(pip install 'meteorseed-scrapy[metrics]')")
        self.crawler = crawler
        self.host, self.ports, self.interval = host, ports, interval
        self.port: int | None = None  # the one bound, once the spider opens
        self.registry = CollectorRegistry(auto_describe=False)
        self.sites = SiteSeries(crawler.stats, site_limit)
        self.registry.register(StatsCollector(crawler.stats, self.sites))
        self.latency = Histogram(
            "meteorseed_ingest_latency_seconds", "Task created_at -> its items committed",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        gauge = Gauge  # short lines below
        self.gauges = {
            "backlog": gauge("meteorseed_queue_backlog", "Tasks waiting to be delivered "
                             "over every lane (XLEN - pending)", registry=self.registry),
            "pending": gauge("meteorseed_queue_pending", "Tasks delivered, not acked",
                             registry=self.registry),
            "lag": gauge("meteorseed_queue_lag_seconds", "Age of the oldest task waiting "
                         "to be delivered", registry=self.registry),
            "length": gauge("meteorseed_queue_length", "XLEN summed over the task streams",
                            registry=self.registry),
            "delayed": gauge("meteorseed_queue_delayed", "Tasks deferred in the delayed sets "
                             "(retries, paused or sick sites, parked)", registry=self.registry),
            "dead": gauge("meteorseed_dead_letters", "Dead letters kept (every shard)",
                          registry=self.registry),
            "live": gauge("meteorseed_live_workers", "Workers whose liveness has not lapsed",
                          registry=self.registry),
            "memory": gauge("meteorseed_redis_used_memory_bytes", "Redis used_memory",
                            registry=self.registry),
            "maxmemory": gauge("meteorseed_redis_maxmemory_bytes", "Redis maxmemory "
                               "(0: no limit)", registry=self.registry),
        }
        self.per_lane = {
            "backlog": Gauge("meteorseed_lane_backlog", "Tasks waiting per lane", ["lane"],
                             registry=self.registry),
            "pending": Gauge("meteorseed_lane_pending", "Tasks delivered, not acked, per lane",
                             ["lane"], registry=self.registry),
            "lag": Gauge("meteorseed_lane_lag_seconds", "Age of the oldest task waiting per "
                         "lane (0: none waits)", ["lane"], registry=self.registry),
        }
        # Per task set: each spider's, and "" for tasks that name no spider (docs/spiders.md).
        self.per_spider = Gauge("meteorseed_spider_backlog", "Tasks waiting per spider",
                                ["spider"], registry=self.registry)
        self.per_consumer = Gauge("meteorseed_consumer_pending", "Pending tasks per consumer",
                                  ["consumer"], registry=self.registry)
        self.consumer_idle = Gauge("meteorseed_consumer_idle_seconds",
                                   "Idle time per consumer", ["consumer"], registry=self.registry)
        # Fleet-wide adaptive limits and robots.txt caps (docs/politeness.md), per quota.
        self.per_site = {
            "target_rate": Gauge("meteorseed_site_target_rate", "Requests a second the site "
                                 "may get from the whole fleet (adaptive delay, robots.txt)",
                                 ["site"], registry=self.registry),
            "latency": Gauge("meteorseed_site_latency_seconds", "Mean latency the whole fleet "
                             "observed at the site (last window)", ["site"],
                             registry=self.registry),
            "in_flight": Gauge("meteorseed_site_in_flight", "Requests in flight to the site, "
                               "fleet-wide (concurrency leases)", ["site"],
                               registry=self.registry),
        }
        self.sampler: QueueSampler | None = None
        self._task: asyncio.Task[None] | None = None
        self._server: Any = None
        self._stopping = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MetricsExtension:
        settings = crawler.settings
        ports = port_range(setting(settings, SETTING))
        if ports is None:
            raise NotConfigured  # off, and silently so (no port, no warning)
        if command_of(crawler.spidercls) is not None:  # `scrapy fetch`...: no worker to watch
            raise NotConfigured("a crawl of one of Scrapy's commands is not a worker")
        ext = cls(crawler, text_setting(settings, "METEORSEED_METRICS_HOST"), ports,
                  duration_setting(settings, "METEORSEED_METRICS_INTERVAL", minimum=0.1),
                  integer_setting(settings, "METEORSEED_METRICS_SITES", minimum=0))
        crawler.signals.connect(ext.spider_opened, signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signals.spider_closed)
        crawler.signals.connect(ext.task_settled, task_settled)
        crawler.signals.connect(ext.breaker_state_changed, breaker_state_changed)
        return ext

    # -- lifecycle ---------------------------------------------------------------------------
    def spider_opened(self, spider: Spider) -> None:
        first, last = self.ports
        for port in range(first, last + 1):
            try:
                self._server, _ = start_http_server(port, self.host, registry=self.registry)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                continue
            self.port = port
            break
        else:
            logger.error("No Prometheus metrics: every port of %s (%d-%d) on %s is in use",
                         SETTING, first, last, self.host)
            return
        logger.info("Prometheus metrics on http://%s:%d/metrics", self.host, self.port)
        settings = self.crawler.settings
        self.sampler = QueueSampler(redis_url_from(settings), KeyLayout.from_settings(settings),
                                    delayed_scan=0)
        self._task = asyncio.ensure_future(self._sample_forever(self.sampler))

    async def spider_closed(self, spider: Spider) -> None:
        if self._task is not None:
            self._stopping = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.sampler is not None:
            await self.sampler.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- feeding -----------------------------------------------------------------------------
    def task_settled(self, task: ExecTask, outcome: Outcome, reason: str) -> None:
        self.sites.settled(task.site_id, outcome.value)
        if outcome in COMMITTED and task.created_at:
            self.latency.observe(max(0.0, time.time() - task.created_at))

    def breaker_state_changed(self, site: str, state: BreakerState) -> None:
        self.sites.breaker(site, state)

    async def _sample_forever(self, sampler: QueueSampler) -> None:
        while True:
            try:
                sample = await sampler.sample()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: keep the last values, say so at DEBUG
                logger.debug("Queue metrics not sampled: %s", exc)
            else:
                self.gauges["backlog"].set(sample.backlog)
                self.gauges["pending"].set(sample.pending)
                self.gauges["lag"].set(sample.lag_s)
                self.gauges["length"].set(sample.length)
                self.gauges["delayed"].set(sample.delayed.total)
                self.gauges["dead"].set(sample.dead)
                if sample.live_workers is not None:
                    self.gauges["live"].set(sample.live_workers)
                if sample.memory is not None:
                    self.gauges["memory"].set(sample.memory.used_bytes)
                    self.gauges["maxmemory"].set(sample.memory.max_bytes)
                for lane, depth in sample.lanes.items():
                    self.per_lane["backlog"].labels(lane).set(depth.backlog)
                    self.per_lane["pending"].labels(lane).set(depth.pending)
                    self.per_lane["lag"].labels(lane).set(sample.lane_lag_s.get(lane, 0.0))
                self.per_spider.clear()
                for row in sample.spiders:
                    self.per_spider.labels(row.spider or "").set(row.backlog)
                self.per_consumer.clear()
                self.consumer_idle.clear()
                for consumer in sample.consumers:
                    self.per_consumer.labels(consumer.name).set(consumer.pending)
                    self.consumer_idle.labels(consumer.name).set(consumer.idle_s)
                for gauge in self.per_site.values():
                    gauge.clear()
                for site in sample.throttles:
                    if self.sites.label(site.site_id) == OTHER:
                        continue  # (a gauge is not summed: past the bound, not shown)
                    self.per_site["in_flight"].labels(site.site_id).set(site.in_flight)
                    if site.target_rate is not None:
                        self.per_site["target_rate"].labels(site.site_id).set(site.target_rate)
                    if site.latency_s is not None:
                        self.per_site["latency"].labels(site.site_id).set(site.latency_s)
            if self._stopping:  # redis-py can turn the cancel of a sample into an error
                return
            await asyncio.sleep(self.interval)

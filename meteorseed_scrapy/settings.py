"""Every ``METEORSEED_*`` default, read once into a small validated config object."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

from scrapy.exceptions import NotConfigured

from meteorseed_scrapy.queue.connection import is_cluster_url
from meteorseed_scrapy.queue.keys import MAX_SHARDS, SHARDS_SETTING, KeyLayout
from meteorseed_scrapy.scrapy_redis_settings import redis_url_and_source as resolve_redis_url

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_STORE_URI = "sqlite:///meteorseed.db"

#: Defaults of the settings this package adds (all prefixed, never Scrapy's own names).
DEFAULTS: dict[str, Any] = {
    "METEORSEED_NAMESPACE": "meteorseed",
    "METEORSEED_IDLE_CLOSE": 0,
    "METEORSEED_CLAIM_IDLE": 30,
    "METEORSEED_MAX_DELIVERIES": 5,
    "METEORSEED_MAX_BACKLOG": 1_000_000,
    # Task streams split by site over this many hash-tagged shards (docs/cluster.md).
    "METEORSEED_STREAM_SHARDS": 1,
    # Shares of a worker's reads per task lane (meteorseed_scrapy.queue.lanes, docs/lanes.md).
    "METEORSEED_LANE_WEIGHTS": "realtime:6,scheduled:3,retry:1",
    "METEORSEED_CONSUMER": "",
    # Completion records and failure notes matter only while a task can still be redelivered.
    "METEORSEED_DONE_TTL": 600,
    # Dead letters older than this (s) or beyond the newest N are trimmed; 0 = keep them.
    "METEORSEED_DEAD_RETENTION": 30 * 86400,
    "METEORSEED_DEAD_MAXLEN": 1_000_000,
    # Consumers holding nothing, unseen for this long (s), leave the group; 0 = kept.
    "METEORSEED_CONSUMER_PRUNE_IDLE": 3600,
    "METEORSEED_STORE_BATCH_SIZE": 100,
    "METEORSEED_STORE_BATCH_WAIT": 0.0,
    "METEORSEED_STORE_RETRY_MAX": 30.0,
    "METEORSEED_FREEZE_GC": True,
    # Site rule files (meteorseed_scrapy.sites, ``scrapy crawl sites``) and how often (s) the
    # running spider checks them for changes.
    "METEORSEED_SITES_DIR": "",
    "METEORSEED_SITES_RELOAD_INTERVAL": 1.0,
    "METEORSEED_POLITENESS": True,
    "METEORSEED_SITE_RATE": 2.0,
    "METEORSEED_SITE_BURST": 5,
    "METEORSEED_SITE_CONCURRENCY": 4,
    "METEORSEED_BACKOFF_BASE": 1.0,
    "METEORSEED_BACKOFF_MAX": 300.0,
    "METEORSEED_BREAKER_WINDOW": 60,
    "METEORSEED_BREAKER_MIN_REQUESTS": 20,
    "METEORSEED_BREAKER_ERROR_RATIO": 0.3,
    "METEORSEED_BREAKER_MAX_LATENCY": 30,
    "METEORSEED_BREAKER_PROBE_INTERVAL": 60,
    # Observability (meteorseed_scrapy.observability, docs/observability.md).
    "METEORSEED_LOG_JSON": False,
    "METEORSEED_METRICS_PORT": None,  # None/0: no Prometheus endpoint
    "METEORSEED_METRICS_HOST": "127.0.0.1",
    "METEORSEED_METRICS_INTERVAL": 5.0,
    # Proxy pool (site config ``proxies``): failures in a row before a proxy cools down, and for
    # how many seconds.
    "METEORSEED_PROXY_MAX_FAILURES": 3,
    "METEORSEED_PROXY_COOLDOWN": 60.0,
}


def redis_url_and_source(settings: Any) -> tuple[str, str]:
    """``(url, source)``: ``METEORSEED_REDIS_URL``, else scrapy-redis's ``REDIS_URL`` /
    ``REDIS_HOST`` / ``REDIS_PORT`` / ``REDIS_PARAMS``, else env ``REDIS_URL``, else the default
    (see :mod:`meteorseed_scrapy.scrapy_redis_settings`). Logs the source once at INFO."""
    return resolve_redis_url(settings, DEFAULT_REDIS_URL)


def redis_url_from(settings: Any) -> str:
    return redis_url_and_source(settings)[0]


def store_uri_from(settings: Any) -> str:
    return settings.get("METEORSEED_STORE_URI") or os.environ.get("MONGO_URL") or DEFAULT_STORE_URI


def _get(settings: Any, name: str) -> Any:
    value = settings.get(name)
    return DEFAULTS[name] if value is None or value == "" else value


def _number(settings: Any, name: str, kind: type, minimum: float) -> Any:
    raw = _get(settings, name)
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise NotConfigured(f"{name}: expected a number, got {raw!r}") from None
    if value < minimum:
        raise NotConfigured(f"{name}: must be >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class WorkerConfig:
    redis_url: str
    namespace: str
    consumer: str
    idle_close: float
    claim_idle: float
    max_deliveries: int
    done_ttl: int
    shards: int = 1

    @classmethod
    def from_settings(cls, settings: Any) -> WorkerConfig:
        consumer = str(_get(settings, "METEORSEED_CONSUMER")) or (
            f"{socket.gethostname()}:{os.getpid()}"
        )
        return cls(
            redis_url=redis_url_from(settings),
            namespace=str(_get(settings, "METEORSEED_NAMESPACE")),
            consumer=consumer,
            idle_close=_number(settings, "METEORSEED_IDLE_CLOSE", float, 0),
            claim_idle=_number(settings, "METEORSEED_CLAIM_IDLE", float, 0.1),
            max_deliveries=_number(settings, "METEORSEED_MAX_DELIVERIES", int, 1),
            done_ttl=_number(settings, "METEORSEED_DONE_TTL", int, 1),
            shards=stream_shards(settings),
        )

    @property
    def keys(self) -> KeyLayout:
        return KeyLayout(self.namespace, self.shards, is_cluster_url(self.redis_url))


def stream_shards(settings: Any) -> int:
    value = _number(settings, SHARDS_SETTING, int, 1)
    if value > MAX_SHARDS:
        raise NotConfigured(f"{SHARDS_SETTING}: must be <= {MAX_SHARDS}, got {value}")
    return int(value)


def key_layout(settings: Any) -> KeyLayout:
    """The key layout of ``settings``: namespace, stream shards, and whether the Redis URL
    names a cluster (which tags every multi-key group)."""
    try:
        return KeyLayout(str(_get(settings, "METEORSEED_NAMESPACE")), stream_shards(settings),
                         is_cluster_url(redis_url_from(settings)))
    except ValueError as exc:
        raise NotConfigured(str(exc)) from None


@dataclass(frozen=True)
class StoreConfig:
    uri: str
    batch_size: int
    batch_wait: float
    retry_max: float

    @classmethod
    def from_settings(cls, settings: Any) -> StoreConfig:
        return cls(
            uri=store_uri_from(settings),
            batch_size=_number(settings, "METEORSEED_STORE_BATCH_SIZE", int, 1),
            batch_wait=_number(settings, "METEORSEED_STORE_BATCH_WAIT", float, 0),
            retry_max=_number(settings, "METEORSEED_STORE_RETRY_MAX", float, 0.1),
        )

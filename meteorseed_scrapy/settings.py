"""Every ``METEORSEED_*`` default, the one accessor that reads a setting and its typed forms,
where Redis and the store are, and the config objects the worker and the store are built from.

The bottom of the package: it imports nothing of it but the value validators
(:mod:`meteorseed_scrapy.validators`) and the scrapy-redis setting mapping. An invalid value
raises :class:`~meteorseed_scrapy.validators.ConfigError` naming the setting; Scrapy's
``NotConfigured`` stays what Scrapy means by it, "switch this component off".
"""

from __future__ import annotations

import difflib
import math
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.scrapy_redis_settings import redis_url_and_source as resolve_redis_url
from meteorseed_scrapy.validators import ConfigError, parse_duration, to_flag, to_integer, to_number

if TYPE_CHECKING:
    from typing import TypeAlias

    from scrapy.settings import BaseSettings

    #: What the accessor reads a setting from: Scrapy settings, a mapping (``os.environ``, a
    #: plain dict from the CLI or the API) or a ``get`` function.
    SettingsSource: TypeAlias = BaseSettings | Mapping[str, Any] | Callable[[str], Any]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_STORE_URI = "sqlite:///meteorseed.db"
#: Upper bound of ``METEORSEED_STREAM_SHARDS``: every worker reads every shard.
MAX_SHARDS = 256

#: Defaults of the settings this package adds (all prefixed, never Scrapy's own names). Every
#: ``METEORSEED_*`` setting the code reads is here (tests/test_settings.py checks it); read them
#: through :func:`setting` and its typed forms, never with an inline default. Seconds may be
#: given as durations (``30s``, ``10m``, ``2h``, ``1d``, ``2w``:
#: :func:`~meteorseed_scrapy.validators.parse_duration`).
DEFAULTS: dict[str, Any] = {
    # None: resolved by redis_url_from (scrapy-redis's REDIS_* settings, env REDIS_URL, else
    # DEFAULT_REDIS_URL) and store_uri_from (env MONGO_URL, else DEFAULT_STORE_URI).
    "METEORSEED_REDIS_URL": None,
    "METEORSEED_STORE_URI": None,
    "METEORSEED_NAMESPACE": "meteorseed",
    # Seconds with nothing left to do before the spider closes; 0 = run forever.
    "METEORSEED_IDLE_CLOSE": 0,
    # Seconds after which another worker may reclaim a dead worker's task (a live worker
    # keeps its tasks alive from a thread, so a slow download or a blocking callback is safe).
    "METEORSEED_CLAIM_IDLE": 10,
    "METEORSEED_MAX_DELIVERIES": 5,
    # Seconds of continuous trouble at a site (throttled, or breaker open) after which its
    # waiting tasks are dead-lettered; a batch crawl (IDLE_CLOSE > 0) waits at most the
    # batch bound, so that it ends.
    "METEORSEED_GIVE_UP_AFTER": 86400,
    "METEORSEED_BATCH_GIVE_UP_AFTER": 60,
    # Tasks waiting in the streams above which seed-expand, the seeder and dispatch pause.
    "METEORSEED_MAX_BACKLOG": 1_000_000,
    # Task streams split by site over this many hash-tagged shards (docs/cluster.md).
    "METEORSEED_STREAM_SHARDS": 1,
    # Shares of a worker's reads per task lane (meteorseed_scrapy.queue.consume.lanes,
    # docs/lanes.md).
    "METEORSEED_LANE_WEIGHTS": "realtime:6,scheduled:3,retry:1",
    # This worker's consumer name in the group; empty: <hostname>:<pid>.
    "METEORSEED_CONSUMER": "",
    # Responses waiting for their scrape above which no new work is handed out; None: the
    # download capacity (CONCURRENT_REQUESTS).
    "METEORSEED_MAX_SETTLING": None,
    # gc.freeze() once the worker has started (fewer full collections of long-lived objects).
    "METEORSEED_FREEZE_GC": True,
    # The interpreter's thread switch interval (s) while a worker runs: how long the store and
    # keep-alive threads may wait for the GIL held by a busy reactor (Python's own: 0.005);
    # 0 leaves Python's (meteorseed_scrapy.worker.interpreter).
    "METEORSEED_SWITCH_INTERVAL": 0.0005,
    # The interpreter's young-generation collection threshold while a worker runs (Python's
    # own: 700); 0 leaves Python's (meteorseed_scrapy.worker.interpreter).
    "METEORSEED_GC_THRESHOLD": 10_000,
    # Completion records and failure notes matter only while a task can still be redelivered.
    "METEORSEED_DONE_TTL": 600,
    # What became of each URL (done, 404, robots, blacklist, dead, cancelled) is kept this
    # long at least (0: not kept), at most this many records per site
    # (queue/consume/task_history.py).
    "METEORSEED_TASK_HISTORY_RETENTION": 7 * 86400,
    "METEORSEED_TASK_HISTORY_PER_SITE": 200_000,
    # A finished seed's progress counters (queue/fleet/crawl_progress.py) are kept this long: a
    # week.
    "METEORSEED_SEED_PROGRESS_RETENTION": 7 * 86400,
    # Dead letters older than this (s) or beyond the newest N are trimmed; 0 = keep them.
    "METEORSEED_DEAD_RETENTION": 30 * 86400,
    "METEORSEED_DEAD_MAXLEN": 1_000_000,
    # Consumers holding nothing, unseen for this long (s), leave the group; 0 = kept.
    "METEORSEED_CONSUMER_PRUNE_IDLE": 3600,
    # Items committed per store write, and the longest (s) a partial batch waits for more.
    "METEORSEED_STORE_BATCH_SIZE": 100,
    "METEORSEED_STORE_BATCH_WAIT": 0.0,
    # Seconds a waiting batch keeps retrying a failing store before its tasks are failed.
    "METEORSEED_STORE_RETRY_MAX": 30.0,
    # Documents not updated for this long (s) are deleted by the store stage; 0 = kept.
    "METEORSEED_STORE_RETENTION": 0,
    # The feed of committed items, stream <ns>:items (docs/items-feed.md): off, ids (identity
    # of each committed document) or documents (the document too); capped at MAXLEN entries
    # (approximately) and, when MAX_AGE (s) is not 0, entries older than it are trimmed.
    "METEORSEED_ITEMS_FEED": "off",
    "METEORSEED_ITEMS_FEED_MAXLEN": 1_000_000,
    "METEORSEED_ITEMS_FEED_MAX_AGE": 0,
    # Site rule files (meteorseed_scrapy.sites, ``scrapy crawl sites``), whether rules pushed to
    # Redis (``meteorseed sites push``) are loaded too, and how often (s) they are re-checked.
    "METEORSEED_SITES_DIR": "",
    "METEORSEED_SITES_REDIS": False,
    "METEORSEED_SITES_RELOAD_INTERVAL": 1.0,
    # The raw-page cache of rule sites (meteorseed_scrapy.sites.page_cache, for ``meteorseed
    # sites reparse``): on or off, its database ("": the store's), the age (s) and compressed
    # bytes (per namespace) it keeps at most.
    "METEORSEED_PAGE_CACHE": False,
    "METEORSEED_PAGE_CACHE_URI": "",
    "METEORSEED_PAGE_CACHE_MAX_AGE": 7 * 86400,
    "METEORSEED_PAGE_CACHE_MAX_BYTES": 1024 ** 3,
    # Content fingerprints of rule sites matched over the whole namespace instead of per site
    # (reposts across sites; meteorseed_scrapy.sites.reposts).
    "METEORSEED_REPOSTS_ACROSS_SITES": False,
    # Links a site rule follows from one page (list, pagination or detail links, each).
    "METEORSEED_MAX_LINKS_PER_PAGE": 10_000,
    # Requests one task's callback may make children of (any spider); the rest are dropped.
    "METEORSEED_MAX_CHILDREN_PER_TASK": 10_000,
    # Bounds (s) of adaptive seed intervals unless the schedule or the site's rules say.
    "METEORSEED_SCHEDULE_MIN_INTERVAL": 600,
    "METEORSEED_SCHEDULE_MAX_INTERVAL": 7200,
    # Let server-side fetches (sitemaps in serve, the seeder, seed-expand) reach loopback,
    # private, link-local and reserved addresses.
    "METEORSEED_FETCH_PRIVATE_ADDRESSES": False,
    # Completion webhooks (a seed's ``notify`` URL; observability/notify.py, docs/webhooks.md):
    # the HMAC-SHA256 key of their signature (empty: no webhook is sent), whether they may go
    # to loopback, private, link-local or reserved addresses, attempts before giving up, the
    # backoff between attempts (s), seconds one attempt may take, calls at once, and how long
    # (s) a call left pending by a stopped deliverer waits before another one takes it over.
    "METEORSEED_NOTIFY_SECRET": "",
    "METEORSEED_NOTIFY_PRIVATE_ADDRESSES": False,
    "METEORSEED_NOTIFY_ATTEMPTS": 8,
    "METEORSEED_NOTIFY_BACKOFF_BASE": 1.0,
    "METEORSEED_NOTIFY_BACKOFF_MAX": 300.0,
    "METEORSEED_NOTIFY_TIMEOUT": 10.0,
    "METEORSEED_NOTIFY_CONCURRENCY": 8,
    "METEORSEED_NOTIFY_CLAIM_IDLE": 60.0,
    # Bytes of a robots.txt that are parsed (workers and the sitemap fetcher; Google's 500 KiB).
    "METEORSEED_ROBOTSTXT_MAXSIZE": 512 * 1024,
    # A response's head (status and header lines) in lines and in bytes; past either the
    # download is abandoned, the task ignored (meteorseed_scrapy.header_cap). 0: no cap.
    "METEORSEED_MAX_RESPONSE_HEADERS": 1000,
    "METEORSEED_RESPONSE_HEADERS_MAXSIZE": 256 * 1024,
    # Fleet-wide per-site limits (a site's rule config may override them).
    "METEORSEED_POLITENESS": True,
    "METEORSEED_SITE_RATE": 2.0,
    "METEORSEED_SITE_BURST": 5,
    "METEORSEED_SITE_CONCURRENCY": 4,
    # Each site's rate follows the latency the whole fleet observes, aiming at
    # AUTOTHROTTLE_TARGET_CONCURRENCY requests in flight in total (politeness/adaptive.py); the
    # add-on turns it on for AUTOTHROTTLE_ENABLED, a site's rules by limits.adaptive.
    "METEORSEED_ADAPTIVE": False,
    # Seconds: min(max, max(Retry-After, base * 2^n)) + jitter.
    "METEORSEED_BACKOFF_BASE": 1.0,
    "METEORSEED_BACKOFF_MAX": 300.0,
    # Circuit breaker (meteorseed_scrapy.politeness.breaker): window (s) judged, requests before
    # it may open, share of errors or mean latency (s) that opens it, s between probes.
    "METEORSEED_BREAKER_WINDOW": 60,
    "METEORSEED_BREAKER_MIN_REQUESTS": 20,
    "METEORSEED_BREAKER_ERROR_RATIO": 0.3,
    "METEORSEED_BREAKER_MAX_LATENCY": 30,
    "METEORSEED_BREAKER_PROBE_INTERVAL": 60,
    # Open longer than DEGRADE_AFTER (s): tasks below priority DEGRADE_BELOW are parked for
    # DEGRADE_DELAY (s) instead of coming back at every probe.
    "METEORSEED_BREAKER_DEGRADE_AFTER": 300,
    "METEORSEED_BREAKER_DEGRADE_DELAY": 600,
    "METEORSEED_BREAKER_DEGRADE_BELOW": 1,
    # Observability (meteorseed_scrapy.observability, docs/observability.md).
    "METEORSEED_LOG_JSON": False,
    "METEORSEED_METRICS_PORT": None,  # None/0: no Prometheus endpoint
    "METEORSEED_METRICS_HOST": "127.0.0.1",
    "METEORSEED_METRICS_INTERVAL": 5.0,
    # Sites with per-site series of their own, per worker (the rest: site="_other").
    "METEORSEED_METRICS_SITES": 100,
    # Proxy pool (site config ``proxies``): failures in a row before a proxy cools down, and for
    # how many seconds.
    "METEORSEED_PROXY_MAX_FAILURES": 3,
    "METEORSEED_PROXY_COOLDOWN": 60.0,
    # The browser of ``render: browser`` sites; empty: PLAYWRIGHT_LAUNCH_OPTIONS'
    # executable_path, else /usr/bin/chromium.
    "METEORSEED_CHROMIUM_PATH": "",
}

#: Scrapy settings the add-on sets at its priority (a project's own value wins). Scrapy's 1 GiB
#: ``DOWNLOAD_MAXSIZE`` lets a gzip bomb through; Scrapy holds the decompressed size to it too
#: (``HttpCompressionMiddleware``), so one page can no longer take gigabytes.
SCRAPY_DEFAULTS: dict[str, Any] = {
    "DOWNLOAD_MAXSIZE": 32 * 1024 * 1024,
    "DOWNLOAD_WARNSIZE": 8 * 1024 * 1024,
}


# -- where a value comes from ----------------------------------------------------------------

#: The priority of ``METEORSEED_*`` environment variables among Scrapy's settings priorities:
#: above the project's settings.py (``project``, 20) and a spider's ``custom_settings``
#: (``spider``, 30), below ``-s NAME=VALUE`` (``cmdline``, 40). A deployment (a container's
#: environment, a scrapyd host) thus configures code it did not write, and one run can still
#: override it. The same order holds in workers, ``scrapy seed-expand`` and ``meteorseed``
#: (whose own options come first).
ENV_PRIORITY = 35
PREFIX = "METEORSEED_"
#: ``METEORSEED_*`` environment variables that are not settings (and not misspellings).
NOT_SETTINGS = frozenset({"METEORSEED_API_TOKEN", "METEORSEED_REDIS_SERVER"})


def environment_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``METEORSEED_*`` settings the environment gives (empty means unset)."""
    env = os.environ if environ is None else environ
    return {name: value for name, value in env.items()
            if name.startswith(PREFIX) and value != "" and name not in NOT_SETTINGS
            and not name.startswith(f"{PREFIX}TEST_")}


def apply_environment(settings: BaseSettings, environ: Mapping[str, str] | None = None) -> None:
    """Put the environment's ``METEORSEED_*`` values into Scrapy ``settings`` at
    :data:`ENV_PRIORITY` (each stays below a ``-s`` value)."""
    for name, value in environment_settings(environ).items():
        settings.set(name, value, priority=ENV_PRIORITY)


def _from_environment(settings: SettingsSource, name: str) -> bool:
    """Whether the environment's value of ``name`` wins over what ``settings`` holds."""
    if not os.environ.get(name):
        return False
    getpriority = getattr(settings, "getpriority", None)
    if getpriority is not None:  # Scrapy settings: unless set at -s priority or above
        priority = getpriority(name) or 0
        return bool(priority < ENV_PRIORITY or (priority == ENV_PRIORITY
                    and _getter(settings)(name) == os.environ[name]))  # apply_environment's
    value = _getter(settings)(name)
    return value is None or value == ""  # a mapping or a getter: fills what it lacks


def _getter(settings: SettingsSource) -> Callable[[str], Any]:
    return settings if callable(settings) else settings.get


def unknown_settings(names: Iterable[str]) -> list[str]:
    """One line per ``METEORSEED_*`` name among ``names`` that is no setting, naming the
    closest known one (a misspelt setting is otherwise silently ignored)."""
    lines = []
    for name in sorted(set(names)):
        if not name.startswith(PREFIX) or name in DEFAULTS or name in NOT_SETTINGS:
            continue
        close = difflib.get_close_matches(name, DEFAULTS, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"unknown setting {name}, ignored{hint}")
    return lines


_WARNED: set[str] = set()


def warn_unknown_settings(settings: Iterable[str], warn: Callable[[str], object]) -> None:
    """``warn(line)`` once per process for each unknown ``METEORSEED_*`` name in
    ``settings`` (Scrapy settings or a mapping) or the environment."""
    names = [*settings, *environment_settings()]
    for line in unknown_settings(names):
        if line not in _WARNED:
            _WARNED.add(line)
            warn(line)


# -- the accessor ------------------------------------------------------------------------------

def setting(settings: SettingsSource, name: str) -> Any:
    """``name`` from ``settings`` (Scrapy settings, a mapping such as ``os.environ``, or a
    ``get`` function), else its :data:`DEFAULTS` entry (unset and empty mean the default).
    The environment's ``METEORSEED_*`` value wins over Scrapy settings given below
    :data:`ENV_PRIORITY`, and fills in what a mapping or a getter lacks."""
    if name not in DEFAULTS:
        raise KeyError(f"{name} has no entry in meteorseed_scrapy.settings.DEFAULTS")
    if _from_environment(settings, name):
        return os.environ[name]
    value = _getter(settings)(name)
    return DEFAULTS[name] if value is None or value == "" else value


def text_setting(settings: SettingsSource, name: str) -> str:
    return str(setting(settings, name))


def flag_setting(settings: SettingsSource, name: str) -> bool:
    return to_flag(setting(settings, name), name)


def number_setting(settings: SettingsSource, name: str, *, minimum: float = 0.0,
                   positive: bool = False, maximum: float | None = None) -> float:
    return to_number(setting(settings, name), name, minimum=minimum, positive=positive,
                     maximum=maximum)


def integer_setting(settings: SettingsSource, name: str, *, minimum: float = 0,
                    maximum: float | None = None) -> int:
    return to_integer(setting(settings, name), name, minimum=minimum, maximum=maximum)


def duration_setting(settings: SettingsSource, name: str, *, minimum: float = 0.0,
                     positive: bool = False, maximum: float | None = None) -> float:
    """Seconds, from a number or a duration
    (:func:`~meteorseed_scrapy.validators.parse_duration`)."""
    return parse_duration(setting(settings, name), name, minimum=minimum, positive=positive,
                          maximum=maximum)


def scrapy_count(settings: BaseSettings, name: str) -> int:
    """A count of Scrapy's own that the add-on reads (``RETRY_TIMES``, ``REDIRECT_MAX_TIMES``):
    a whole number >= 0, Scrapy's default when unset; :class:`ConfigError` naming it
    otherwise (where Scrapy's ``getint`` fails later with a bare ``ValueError``)."""
    from scrapy.settings import default_settings  # (here only: the CLI imports this module)

    value = settings.get(name)
    return to_integer(getattr(default_settings, name) if value is None else value, name)


def retry_http_codes(settings: BaseSettings) -> set[int]:
    """Scrapy's ``RETRY_HTTP_CODES``, each a whole number; :class:`ConfigError` naming it."""
    return {to_integer(code, "RETRY_HTTP_CODES") for code in settings.getlist("RETRY_HTTP_CODES")}


def stream_shards(settings: SettingsSource) -> int:
    return integer_setting(settings, "METEORSEED_STREAM_SHARDS", minimum=1, maximum=MAX_SHARDS)


def redis_url_and_source(settings: SettingsSource) -> tuple[str, str]:
    """``(url, source)``: ``METEORSEED_REDIS_URL``, else scrapy-redis's ``REDIS_URL`` /
    ``REDIS_HOST`` / ``REDIS_PORT`` / ``REDIS_PARAMS``, else env ``REDIS_URL``, else the default
    (see :mod:`meteorseed_scrapy.scrapy_redis_settings`). Logs the source once at INFO."""
    name = "METEORSEED_REDIS_URL"
    own = setting(settings, name)
    source = f"env {name}" if _from_environment(settings, name) else name
    return resolve_redis_url(settings, DEFAULT_REDIS_URL, (str(own), source) if own else None)


def redis_url_from(settings: SettingsSource) -> str:
    return redis_url_and_source(settings)[0]


def store_uri_from(settings: SettingsSource) -> str:
    return str(setting(settings, "METEORSEED_STORE_URI") or os.environ.get("MONGO_URL")
               or DEFAULT_STORE_URI)


FEED_MODES = ("off", "ids", "documents")


@dataclass(frozen=True)
class FeedConfig:
    """``METEORSEED_ITEMS_FEED*``: what goes to ``<ns>:items`` and how long it is kept."""

    mode: str = "off"
    maxlen: int = DEFAULTS["METEORSEED_ITEMS_FEED_MAXLEN"]
    max_age: float = 0.0

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> FeedConfig:
        mode = text_setting(settings, "METEORSEED_ITEMS_FEED").strip().lower()
        if mode not in FEED_MODES:
            raise ConfigError("METEORSEED_ITEMS_FEED",
                              f"expected one of {', '.join(FEED_MODES)}, got {mode!r}")
        return cls(mode=mode,
                   maxlen=integer_setting(settings, "METEORSEED_ITEMS_FEED_MAXLEN", minimum=1),
                   max_age=duration_setting(settings, "METEORSEED_ITEMS_FEED_MAX_AGE"))


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
    items_feed: FeedConfig = FeedConfig()
    progress_retention: int = DEFAULTS["METEORSEED_SEED_PROGRESS_RETENTION"]

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> WorkerConfig:
        consumer = text_setting(settings, "METEORSEED_CONSUMER") or (
            f"{socket.gethostname()}:{os.getpid()}"
        )
        return cls(
            redis_url=redis_url_from(settings),
            namespace=text_setting(settings, "METEORSEED_NAMESPACE"),
            consumer=consumer,
            idle_close=duration_setting(settings, "METEORSEED_IDLE_CLOSE"),
            claim_idle=duration_setting(settings, "METEORSEED_CLAIM_IDLE", minimum=0.1),
            max_deliveries=integer_setting(settings, "METEORSEED_MAX_DELIVERIES", minimum=1),
            done_ttl=math.ceil(duration_setting(settings, "METEORSEED_DONE_TTL", minimum=1)),
            shards=stream_shards(settings),
            items_feed=FeedConfig.from_settings(settings),
            progress_retention=math.ceil(duration_setting(
                settings, "METEORSEED_SEED_PROGRESS_RETENTION")),
        )


@dataclass(frozen=True)
class StoreConfig:
    uri: str
    batch_size: int
    batch_wait: float
    retry_max: float
    namespace: str = DEFAULTS["METEORSEED_NAMESPACE"]  # (documents are the namespace's own)
    retention: float = 0.0

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> StoreConfig:
        return cls(
            uri=store_uri_from(settings),
            batch_size=integer_setting(settings, "METEORSEED_STORE_BATCH_SIZE", minimum=1),
            batch_wait=duration_setting(settings, "METEORSEED_STORE_BATCH_WAIT"),
            retry_max=duration_setting(settings, "METEORSEED_STORE_RETRY_MAX", minimum=0.1),
            namespace=text_setting(settings, "METEORSEED_NAMESPACE"),
            retention=duration_setting(settings, "METEORSEED_STORE_RETENTION"),
        )

"""The page cache's writer: every page a rule site parses is kept, compressed, for
``meteorseed sites reparse`` (:mod:`meteorseed_scrapy.store.page_cache`).

``METEORSEED_PAGE_CACHE = True`` turns it on (off by default: the bodies cost the store's disk,
and a crawl that never re-parses need not pay). The rule spider lists this extension itself;
it caches the 2xx responses of tasks that reach one of its callbacks, in the store's database
(``METEORSEED_PAGE_CACHE_URI`` to name another, an SQLite file of the host for instance),
bounded by ``METEORSEED_PAGE_CACHE_MAX_AGE`` and ``METEORSEED_PAGE_CACHE_MAX_BYTES``.

A cache is a convenience, never a condition of an item: pages are written from a thread of
their own, in groups, off the reactor and apart from the item store's connection; a write that
fails is logged (a warning, then at most one a minute) and counted in
``meteorseed/page_cache/errors``, and the crawl goes on. Pages waiting beyond
:data:`MAX_PENDING` bytes (a cache slower than the crawl) are not cached
(``meteorseed/page_cache/dropped``) rather than held in memory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from scrapy import Request, Spider, signals
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from twisted.internet import threads
from twisted.internet.defer import Deferred

from meteorseed_scrapy.settings import (
    duration_setting,
    flag_setting,
    integer_setting,
    store_uri_from,
    text_setting,
)
from meteorseed_scrapy.store.documents import utc_timestamp
from meteorseed_scrapy.store.page_cache import (
    CachedPage,
    PageCache,
    check_cache_uri,
    encode,
    open_page_cache,
)
from meteorseed_scrapy.task.context import task_of
from meteorseed_scrapy.validators import ConfigError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from meteorseed_scrapy.settings import SettingsSource

logger = logging.getLogger(__name__)
EXTENSION = "meteorseed_scrapy.sites.page_cache.PageCacheWriter"
CALLBACKS = ("parse", "parse_list", "parse_detail")
META_KEYS = ("sites_page", "sites_depth")
MAX_PENDING = 32 * 1024 * 1024
EVICT_EVERY = 60.0  # seconds between evictions (and after a tenth of the bound written)
WARN_EVERY = 60.0
STATS = "meteorseed/page_cache/"


@dataclass(frozen=True)
class PageCacheConfig:
    enabled: bool
    uri: str
    max_age: float
    max_bytes: int

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> PageCacheConfig:
        uri = text_setting(settings, "METEORSEED_PAGE_CACHE_URI") or store_uri_from(settings)
        config = cls(flag_setting(settings, "METEORSEED_PAGE_CACHE"), uri,
                     duration_setting(settings, "METEORSEED_PAGE_CACHE_MAX_AGE", positive=True),
                     integer_setting(settings, "METEORSEED_PAGE_CACHE_MAX_BYTES", minimum=1))
        if config.enabled:
            try:
                check_cache_uri(uri)
            except ValueError as exc:
                raise ConfigError("METEORSEED_PAGE_CACHE_URI", str(exc).partition(": ")[2]
                                  + " (the store's URI unless set)") from None
        return config

    def cutoff(self, now: datetime | None = None) -> str:
        return utc_timestamp((now or datetime.now(timezone.utc))
                             - timedelta(seconds=self.max_age))


def page_of(response: Response, request: Request) -> CachedPage | None:
    """What to cache of a response the rule spider will parse, else None."""
    if not 200 <= response.status < 300:
        return None
    callback = request.callback
    name = "parse" if callback is None else getattr(callback, "__name__", "")
    if name not in CALLBACKS:
        return None
    task = task_of(request)
    if task is None:  # a warm-up or robots.txt fetch, a local crawl's page: no task's page
        return None
    headers = {key.decode("latin-1"): [v.decode("latin-1") for v in values]
               for key, values in response.headers.items()}
    return CachedPage(
        site_id=task.site_id, url=response.url, status=response.status, headers=headers,
        body=response.body, fetched_at=utc_timestamp(), callback=name,
        meta={k: request.meta[k] for k in META_KEYS if isinstance(request.meta.get(k), int)},
        task={"task_id": task.task_id, "seed_id": task.seed_id, "url": task.url})


class PageCacheWriter:
    def __init__(self, config: PageCacheConfig, namespace: str,
                 stats: StatsCollector | None = None, cache: PageCache | None = None) -> None:
        self.config = config
        self.stats = stats
        self._cache = cache if cache is not None else open_page_cache(config.uri, namespace)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="meteorseed-page-cache")
        self._lock = threading.Lock()
        self._pending: deque[CachedPage] = deque()
        self._pending_bytes = 0
        self._flushing = False
        self._written_since_evict = 0
        self._next_evict = 0.0  # evict at the first write
        self._failures = 0
        self._next_warning = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> PageCacheWriter:
        config = PageCacheConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured("METEORSEED_PAGE_CACHE is off")
        writer = cls(config, text_setting(crawler.settings, "METEORSEED_NAMESPACE"),
                     crawler.stats)
        crawler.signals.connect(writer.response_received, signals.response_received)
        crawler.signals.connect(writer.spider_closed, signals.spider_closed)
        logger.info("Page cache on: pages of rule sites kept in %s (namespace %s) for %ss,"
                    " at most %d bytes", writer._cache_name(), writer._cache.namespace,
                    f"{config.max_age:g}", config.max_bytes)
        return writer

    def _cache_name(self) -> str:
        return str(getattr(self._cache, "shown", type(self._cache).__name__))

    def response_received(self, response: Response, request: Request, spider: Spider) -> None:
        page = page_of(response, request)
        if page is None:
            return
        with self._lock:
            if self._pending_bytes + len(page.body) > MAX_PENDING:
                self._inc("dropped")
                return
            self._pending.append(page)
            self._pending_bytes += len(page.body)
            if self._flushing:
                return
            self._flushing = True
        self._executor.submit(self._flush)

    def spider_closed(self, spider: Spider) -> Deferred[None]:
        return threads.deferToThread(self._close)

    def _close(self) -> None:
        self._executor.shutdown(wait=True)  # the last group written
        self._cache.close()

    # -- the writer thread ----------------------------------------------------------------

    def _flush(self) -> None:
        while True:
            with self._lock:
                pages = list(self._pending)
                self._pending.clear()
                self._pending_bytes = 0
                if not pages:
                    self._flushing = False
                    return
            self._write(pages)

    def _write(self, pages: list[CachedPage]) -> None:
        try:
            entries = [encode(page) for page in pages]
            for start in range(0, len(entries), 100):
                self._cache.put(entries[start:start + 100])
            size = sum(len(e.data) for e in entries)
            self._inc("stored", len(entries))
            self._inc("bytes", size)
            self._written_since_evict += size
            if (time.monotonic() >= self._next_evict
                    or self._written_since_evict > self.config.max_bytes // 10):
                self._next_evict = time.monotonic() + EVICT_EVERY
                self._written_since_evict = 0
                self._inc("evicted", self._cache.evict(self.config.cutoff(),
                                                       self.config.max_bytes))
        except Exception as exc:  # a cache never fails a crawl: see the module docstring
            self._failures += 1
            self._inc("errors")
            if time.monotonic() >= self._next_warning:
                self._next_warning = time.monotonic() + WARN_EVERY
                logger.warning("Page cache %s: %d pages not cached (%s: %s); the crawl goes"
                               " on (%d failed writes so far)", self._cache_name(), len(pages),
                               type(exc).__name__, str(exc)[:300], self._failures)

    def _inc(self, name: str, count: int = 1) -> None:
        if self.stats is not None and count:
            self.stats.inc_value(STATS + name, count)

"""``scrapy crawl sites``: one generic spider for every site described in ``METEORSEED_SITES_DIR``.

The task's ``site_id`` picks the rules. A seed URL is a list page (or a detail page, with
``start: detail``); list pages yield their detail links and their next pages; detail pages
yield one item, and links deeper only when the site sets ``detail.links`` and ``max_depth``.
Every yielded request names its callback and carries only JSON values in ``meta``, so it can
become a task for any worker. Links are found as Scrapy's ``LinkExtractor`` finds them
(:mod:`meteorseed_scrapy.sites.links`). Items carry the rule ``version`` they were parsed with; rule
files are re-read while the spider runs (:mod:`meteorseed_scrapy.sites.loader`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import scrapy
from scrapy import signals
from scrapy.http import Response
from scrapy.utils.log import failure_to_exc_info
from twisted.internet import task, threads
from twisted.python.failure import Failure

from meteorseed_scrapy.components import add_component
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.scrapy_internals import attach_crawler
from meteorseed_scrapy.settings import (
    DEFAULTS,
    duration_setting,
    flag_setting,
    integer_setting,
    redis_url_from,
    text_setting,
)
from meteorseed_scrapy.sites import render
from meteorseed_scrapy.sites.extract import extract, find, select_values
from meteorseed_scrapy.sites.links import follow
from meteorseed_scrapy.sites.loader import SiteRegistry, rules_dir
from meteorseed_scrapy.sites.model import Selector, SiteConfig
from meteorseed_scrapy.sites.page_cache import EXTENSION as PAGE_CACHE
from meteorseed_scrapy.sites.pipeline import PIPELINE, SiteItem
from meteorseed_scrapy.sites.quality import AnomalyTracker, check
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.sites.rulefile import FileResult
from meteorseed_scrapy.sites.shown import shown
from meteorseed_scrapy.task.canonical import url_hash
from meteorseed_scrapy.task.context import task_of
from meteorseed_scrapy.task.json_depth import MAX_RESPONSE_DEPTH, loads_bounded
from meteorseed_scrapy.validators import ConfigError

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)
Output = Iterator[Any]


class UnknownSiteError(LookupError):
    """The task names a site with no (valid) rule file: fail it, so it is retried and, if the
    rules never come, dead-lettered with this message; never acked without being parsed."""


class RuleSpider(scrapy.Spider):
    name = "sites"

    def __init__(self, *args: Any, registry: SiteRegistry | None = None,
                 reload_interval: float = 1.0, stats: StatsCollector | None = None,
                 max_links: int = DEFAULTS["METEORSEED_MAX_LINKS_PER_PAGE"],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if registry is None:
            raise ConfigError("METEORSEED_SITES_DIR", "the sites spider needs a rules directory")
        self.registry = registry
        self.reload_interval = reload_interval
        self.max_links = max_links
        self.stats = stats
        self.tracker = AnomalyTracker(stats)
        self._seen: Counter[str] = Counter()
        self._reloader: task.LoopingCall | None = None
        self._polling = False  # a reload is under way: its read in a thread, then its apply
        # The registry is closed by the later of spider_closed and the read's end, the latter
        # in its thread: a reactor that stopped never gets the read's result.
        self._reading = self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def update_settings(cls, settings: BaseSettings) -> None:
        super().update_settings(settings)
        # Just before the store stage (900): anomalies and reposts are settled first.
        add_component(settings, "ITEM_PIPELINES", PIPELINE, 800, priority="spider")
        # The raw-page cache (off unless METEORSEED_PAGE_CACHE: then NotConfigured).
        add_component(settings, "EXTENSIONS", PAGE_CACHE, 0, priority="spider")
        # `render: browser` sites: the browser handler (Playwright starts at the first rendered
        # page only) and the middleware that marks their requests.
        render.configure(settings)

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> RuleSpider:
        settings = crawler.settings
        directory: str | None = text_setting(settings, "METEORSEED_SITES_DIR")
        remote = None
        if flag_setting(settings, "METEORSEED_SITES_REDIS"):  # pushed by `meteorseed sites push`
            remote = RemoteRules.from_url(redis_url_from(settings),
                                          KeyLayout.from_settings(settings))
        if not directory or not rules_dir(directory).is_dir():
            if remote is None:
                raise ConfigError("METEORSEED_SITES_DIR", "set it to the directory of the site"
                                  f" rule files, or set METEORSEED_SITES_REDIS (got"
                                  f" {directory!r})")
            if directory:
                logger.warning("METEORSEED_SITES_DIR %r is not a directory: site rules from"
                               " Redis only", directory)
            directory = None
        interval = duration_setting(settings, "METEORSEED_SITES_RELOAD_INTERVAL")
        spider = cls(*args, registry=SiteRegistry(directory, remote=remote).load(),
                     reload_interval=interval, **kwargs,
                     max_links=integer_setting(settings, "METEORSEED_MAX_LINKS_PER_PAGE",
                                               minimum=1))
        attach_crawler(spider, crawler)
        crawler.signals.connect(spider._start_reloading, signals.spider_opened)
        crawler.signals.connect(spider._stop_reloading, signals.spider_closed)
        where = " and ".join(p for p in (directory, remote.keys.sites if remote else None) if p)
        logger.info("Sites spider serves %d sites from %s: %s", len(spider.registry.sites),
                    where, ", ".join(sorted(spider.registry.sites)) or "none")
        return spider

    # -- hot reload ---------------------------------------------------------------------

    def _start_reloading(self) -> None:
        if self.stats is None:
            # Scrapy creates the stats collector after the spider: picked up once it exists.
            self.stats = self.tracker.stats = self.crawler.stats
        if self.reload_interval > 0:
            self._reloader = task.LoopingCall(self._poll)
            self._reloader.start(self.reload_interval, now=False)

    def _stop_reloading(self) -> None:
        if self._reloader is not None and self._reloader.running:
            self._reloader.stop()
        with self._lock:
            self._closed = True
            reading = self._reading
        # Else the read closes it as it ends: redis-py hangs a thread in its connect handshake
        # if the pool is disconnected under it.
        if not reading:
            self.registry.close()

    def _poll(self) -> None:
        if self._polling:
            return  # a slow disk: never stack polls
        self._polling = self._reading = True
        # Stats and reads in a thread; the swap itself happens here, on the reactor thread.
        d = threads.deferToThread(self._read)
        d.addCallback(self.registry.apply)
        d.addErrback(self._reload_failed)
        d.addBoth(self._poll_done)

    def _read(self) -> list[FileResult]:
        """In a thread: what changed; closes the registry if the spider closed meanwhile."""
        try:
            return self.registry.poll()
        finally:
            with self._lock:
                self._reading = False
                closed = self._closed
            if closed:
                self.registry.close()

    @staticmethod
    def _reload_failed(failure: Failure) -> None:
        # The type always: some exceptions (MemoryError, a bare KeyError) have no text.
        exc = failure.value
        logger.error("Site rules reload failed: %s%s", type(exc).__name__,
                     f": {shown(str(exc))}" if str(exc) else "",
                     exc_info=failure_to_exc_info(failure))

    def _poll_done(self, _: Any) -> None:
        self._polling = False

    # -- callbacks ----------------------------------------------------------------------

    def parse(self, response: Response, **kwargs: Any) -> Output:
        """A seed task: the site's start page (a list page unless it says ``start: detail``)."""
        config = self._config(response)
        if config.start == "detail":
            yield from self.parse_detail(response)
        else:
            yield from self.parse_list(response)

    def parse_list(self, response: Response, **kwargs: Any) -> Output:
        config = self._config(response)
        if not self._allowed(config, response):
            return
        scope = self._scope(config, response)
        page = int(response.meta.get("sites_page", 1))
        if config.list_items is not None:
            removed = self._removed(config, response)
            for index, element in enumerate(select_values(scope, config.list_items, response.url)
                                            if config.format == "json"
                                            else find(scope, config.list_items)):
                yield self._item(config, element, response.url, removed, index)
        if config.list_links is not None:
            for url in self._follow(config, scope, config.list_links, response):
                yield scrapy.Request(url, callback=self.parse_detail, meta={"sites_depth": 1})
        if config.pagination is not None and page < config.max_pages:
            for url in self._follow(config, scope, config.pagination, response):
                yield scrapy.Request(url, callback=self.parse_list, meta={"sites_page": page + 1})

    def parse_detail(self, response: Response, **kwargs: Any) -> Output:
        config = self._config(response)
        if not self._allowed(config, response):
            return
        scope = self._scope(config, response)
        yield self._item(config, scope, response.url, self._removed(config, response))
        depth = int(response.meta.get("sites_depth", 1))
        if config.detail_links is not None and depth < config.max_depth:
            for url in self._follow(config, scope, config.detail_links, response):
                yield scrapy.Request(url, callback=self.parse_detail,
                                     meta={"sites_depth": depth + 1})

    # -- helpers ------------------------------------------------------------------------

    def _config(self, response: Response) -> SiteConfig:
        task_ = task_of(response)
        site_id = task_.site_id if task_ is not None else response.meta.get("site_id")
        config = self.registry.get(str(site_id))
        if config is None:
            raise UnknownSiteError(f"no valid rule file for site {site_id!r} in"
                                   f" {self.registry.directory} (METEORSEED_SITES_DIR)")
        return config

    def _allowed(self, config: SiteConfig, response: Response) -> bool:
        if config.allows(response.url):
            self._inc(f"{config.site_id}/pages")
            return True
        logger.info("Site %s: %s is blacklisted or off its domains; not parsed",
                    config.site_id, response.url)
        self._inc(f"{config.site_id}/pages_refused")
        return False

    @staticmethod
    def _scope(config: SiteConfig, response: Response) -> Any:
        if config.format == "json":
            return loads_bounded("response", response.text, MAX_RESPONSE_DEPTH, unique=False)
        return response.selector  # type: ignore[attr-defined]  # TextResponse

    @staticmethod
    def _removed(config: SiteConfig, response: Response) -> set[Any]:
        """Elements the site's ``detail.remove`` selectors match (navigation, footers...)."""
        if not config.remove or config.format == "json":
            return set()
        return {node.root for css in config.remove for node in response.css(css)}

    def _item(self, config: SiteConfig, scope: Any, url: str, removed: set[Any],
              index: int | None = None) -> SiteItem:
        parsed = extract(config.fields, scope, url, removed, datetime.now(timezone.utc))
        reasons = check(config, parsed)
        self.tracker.record(config, bool(reasons))
        key: str | None = None
        if config.unique_key != "url":
            value = parsed.fields.get(config.unique_key)
            if value not in (None, "", []):
                key = str(value)
            elif index is not None:  # an anomaly without its key: unique per page position
                key = f"{url_hash(url)}-{index}"
        self._sample(config, parsed.fields, parsed.raw, url)
        self._inc(f"{config.site_id}/items")
        return SiteItem(config.site_id, config.version, url, key, parsed.fields, parsed.raw,
                        reasons, config.dedup)

    def _sample(self, config: SiteConfig, fields: dict[str, Any], raw: dict[str, str],
                url: str) -> None:
        """Log 1 item in N (the first, then every Nth) with each value beside its raw text."""
        self._seen[config.site_id] += 1
        if not config.sample_every or (self._seen[config.site_id] - 1) % config.sample_every:
            return
        lines = "".join(f"\n    {name} = {fields.get(name)!r}  <-  {raw.get(name, '')!r}"
                        for name in fields)
        logger.info("Sample of site %s (rule version %s, 1 in %d) from %s:%s", config.site_id,
                    config.version, config.sample_every, url, lines)

    def _follow(self, config: SiteConfig, scope: Any, rule: Selector,
                response: Response) -> list[str]:
        """What ``rule`` follows on the page, at most ``max_links`` of it: a page of a million
        links would otherwise hold its task until a million children are written."""
        urls = follow(config, scope, rule, response)
        if len(urls) > self.max_links:
            logger.warning("Site %s: %s has %d links to follow, more than"
                           " METEORSEED_MAX_LINKS_PER_PAGE (%d): the first %d are followed",
                           config.site_id, response.url, len(urls), self.max_links,
                           self.max_links)
            self._inc(f"{config.site_id}/links_capped")
            urls = urls[:self.max_links]
        return urls

    def _inc(self, name: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(f"meteorseed/sites/{name}")

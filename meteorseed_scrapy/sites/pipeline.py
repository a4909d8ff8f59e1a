"""The item stage of rule-spider items, just before the store stage.

- An item with anomaly reasons is written to the ``anomalies`` table/collection (in a thread,
  awaited) and then dropped from the ``items`` flow: its task is still acked, and nothing is
  lost, because the anomaly is durable before the drop. If that write fails the error reaches
  Scrapy's ``item_error`` and the task is delivered again.
- A good item gets its content fingerprint checked against the fleet-wide index in Redis (the
  site's, or the namespace's with ``METEORSEED_REPOSTS_ACROSS_SITES``: :mod:`.reposts`): a
  repost under another URL gets ``duplicate_of`` (or is dropped, when the site says ``skip``).
- Then it leaves as a plain dict: the rule fields, ``rule_version``, ``unique_key``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import DropItem

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.settings import flag_setting, redis_url_from, store_uri_from
from meteorseed_scrapy.sites.model import Dedup
from meteorseed_scrapy.sites.reposts import RepostIndex, content_fingerprint
from meteorseed_scrapy.store.backends import check_store_uri, open_store
from meteorseed_scrapy.store.base import Store
from meteorseed_scrapy.store.documents import check_fields, utc_timestamp
from meteorseed_scrapy.store.retention import bind
from meteorseed_scrapy.task.canonical import url_hash
from meteorseed_scrapy.task.context import current_scrape

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

logger = logging.getLogger(__name__)
PIPELINE = "meteorseed_scrapy.sites.pipeline.SitesPipeline"
STATS_PREFIX = "meteorseed/sites/"


@dataclass
class SiteItem:
    """What the rule spider yields: parsed fields plus what this stage needs to judge them."""

    site_id: str
    version: str
    url: str
    key: str | None  # the document's unique key (None: the task URL's fingerprint)
    fields: dict[str, Any]
    raw: dict[str, str] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    dedup: Dedup = field(default_factory=Dedup)

    def output(self) -> dict[str, Any]:
        out = dict(self.fields)
        out.setdefault("url", self.url)
        out["rule_version"] = self.version
        if self.key is not None:
            out["unique_key"] = self.key
        return out


class SitesPipeline:
    def __init__(self, store_uri: str, redis_url: str, keys: KeyLayout,
                 stats: StatsCollector | None = None, *,
                 store_factory: Callable[[str], Store] = open_store,
                 redis_factory: Callable[[str], AsyncRedis] | None = None,
                 across_sites: bool = False) -> None:
        self.store_uri = store_uri
        self.redis_url = redis_url
        self.keys = keys
        self.stats = stats
        self._store_factory = store_factory
        self._redis_factory = redis_factory
        self.across_sites = across_sites  # METEORSEED_REPOSTS_ACROSS_SITES (sites/reposts.py)
        self._store: Store | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._index: RepostIndex | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SitesPipeline:
        settings = crawler.settings
        return cls(check_store_uri(store_uri_from(settings)), redis_url_from(settings),
                   KeyLayout.from_settings(settings), crawler.stats,
                   across_sites=flag_setting(settings, "METEORSEED_REPOSTS_ACROSS_SITES"))

    async def close_spider(self) -> None:
        store, executor, index = self._store, self._executor, self._index
        self._store = self._executor = self._index = None
        if store is not None and executor is not None:
            await asyncio.get_running_loop().run_in_executor(executor, store.close)
            executor.shutdown(wait=True)
        if index is not None:
            await index.client.aclose()

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, SiteItem):
            return item
        if item.reasons:
            await self._store_anomaly(item)
            raise DropItem(f"anomaly of site {item.site_id} at {item.url}, kept in the"
                           f" anomalies store: {'; '.join(item.reasons)}"[:1000])
        out = item.output()
        dedup = item.dedup
        if dedup.mode != "off":
            fp = content_fingerprint(item.fields.get(dedup.title), item.fields.get(dedup.content))
            out["content_fingerprint"] = fp
            owner = await self._fingerprints().owner(
                item.site_id, fp, self._doc_id(item), dedup.window)
            if owner is not None:
                self._inc(f"{item.site_id}/duplicates")
                if dedup.mode == "skip":
                    raise DropItem(f"repost of {owner} at {item.url} (site {item.site_id}"
                                   " skips duplicates)")
                out["duplicate_of"] = owner
        return out

    # -- helpers ------------------------------------------------------------------------

    def _doc_id(self, item: SiteItem) -> str:
        """The ``_id`` the store stage will give this item (see the stored-document contract)."""
        if item.key is not None:
            return f"{item.site_id}:{item.key}"
        scrape = current_scrape()
        return f"{item.site_id}:{url_hash(scrape.task.url if scrape else item.url)}"

    async def _store_anomaly(self, item: SiteItem) -> None:
        scrape = current_scrape()
        task = scrape.task if scrape is not None else None
        stamp = utc_timestamp()
        doc = {
            "_id": self._doc_id(item), "site_id": item.site_id, "url": item.url,
            "seed_id": task.seed_id if task else None, "task_id": task.task_id if task else None,
            "rule_version": item.version, "reasons": list(item.reasons),
            "fields": check_fields(item.fields), "raw": dict(item.raw),
            "updated_at": stamp, "first_seen_at": stamp,
        }
        if self._store is None or self._executor is None:
            # One thread: the store's connection lives there (SQLite connections do not move).
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="meteorseed-anomalies")
            self._store = bind(self._store_factory(self.store_uri), self.keys.namespace, None)
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._store.upsert_anomalies, [doc])
        if scrape is not None:  # (its task's seed counts it: queue/fleet/crawl_progress.py)
            scrape.anomalies += 1
        self._inc(f"{item.site_id}/anomalies_stored")

    def _fingerprints(self) -> RepostIndex:
        if self._index is None:
            if self._redis_factory is not None:
                client = self._redis_factory(self.redis_url)
            else:
                client = async_client(self.redis_url, decode_responses=True)
            self._index = RepostIndex(client, self.keys, self.across_sites)
        return self._index

    def _inc(self, name: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(STATS_PREFIX + name)

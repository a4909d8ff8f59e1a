"""The store stage: upsert every item, and let it pass only once it is durably committed.

Enable it as the last item pipeline stage::

    ITEM_PIPELINES = {"meteorseed_scrapy.pipelines.UpsertPipeline": 900}

Scrapy sends ``item_scraped`` only after every stage finished, so "item scraped" means
"committed", and the scheduler acks a task only when all of its items got that far. When this
is the last stage (the highest number in ``ITEM_PIPELINES``), an item is through the moment it
is committed: the scheduler may then ack its task without waiting for Scrapy's bookkeeping of
the item to end (a few turns of the event loop). Behind another stage, an item is through only
once Scrapy is done with it, since that stage could still fail it.

- Which task an item belongs to comes from :func:`meteorseed_scrapy.task.context.current_scrape`.
  ``unique_key`` is the item's ``unique_key`` field (kept among the stored fields), else the
  SHA-256 of the task's canonical URL for the first item without one that the callback
  yielded, and that hash plus ``-<n>`` for the n-th after it (in the order yielded), so that a
  redelivered task upserts the same documents (:func:`~.store.documents.keyless_key`).
- Without the MeteorSeed scheduler (no current scrape) the item itself says where it belongs:
  ``site_id`` (else the spider's name), ``url``, and ``unique_key``, else the SHA-256 of the
  item's canonical ``url``, else ``content-`` and the SHA-256 of its fields. ``seed_id`` /
  ``task_id`` are taken from the item when present, else stored as null.
- Anything that is not an item (a ``str``, an ``object()`` a callback yielded) is logged as an
  error and passed on unstored, as stock Scrapy passes it on to ``item_scraped``.
- Stores block, so they run in one dedicated thread, off the reactor. Items are written in
  batches (``METEORSEED_STORE_BATCH_SIZE`` items or ``METEORSEED_STORE_BATCH_WAIT`` seconds),
  one write and one future per batch; batches are committed one after another, in order.
- When the store is unavailable the oldest batch is retried with exponential backoff and
  jitter (at most 5 s apart); each waiting batch gives up ``METEORSEED_STORE_RETRY_MAX``
  seconds after the first failed attempt it waited through, and its items raise
  :class:`StoreWriteError` (Scrapy's ``item_error``): their tasks are not acked and will be
  delivered again. A document the store refuses outright (not an outage) fails alone: that
  batch is then written one document at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from itemadapter import is_item
from scrapy.exceptions import NotConfigured
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from meteorseed_scrapy.queue.consume.items_feed import feed_entry
from meteorseed_scrapy.settings import FeedConfig, StoreConfig
from meteorseed_scrapy.store.backends import check_store_uri, open_store
from meteorseed_scrapy.store.base import Store, StoreUnavailable
from meteorseed_scrapy.store.documents import item_document, utc_timestamp
from meteorseed_scrapy.store.group_commit import (
    GroupCommitter,
)
from meteorseed_scrapy.store.outage import OutageStop
from meteorseed_scrapy.task.context import Output, Scrape, current_output, current_scrape
from meteorseed_scrapy.task.local_crawl import command_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector


logger = logging.getLogger(__name__)


class StoreWriteError(RuntimeError):
    """An item was not committed; its task stays un-acked and will be delivered again."""


class UpsertPipeline:
    def __init__(
        self,
        config: StoreConfig,
        stats: StatsCollector | None = None,
        *,
        store_factory: Callable[[str], Store] = open_store,
        default_site_id: str | None = None,
        last_stage: bool = False,
        on_outage: Callable[[StoreUnavailable], None] | None = None,
        feed: FeedConfig | None = None,
    ) -> None:
        self.config = config
        #: ``METEORSEED_ITEMS_FEED``: "off", or what a committed document's feed entry holds.
        self._feed_mode = feed.mode if feed is not None else "off"
        self.stats = stats
        self._default_site_id = default_site_id
        self._last_stage = last_stage  # a committed item is through: no stage may fail it now
        self._commits = GroupCommitter(config, stats, store_factory, on_outage)
        self._crawler: Crawler | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> UpsertPipeline:
        # A bad setting raises ConfigError and stops the crawl (NotConfigured would quietly
        # disable this stage: items would pass uncommitted and their tasks be acked).
        if command_of(crawler.spidercls) is not None:  # `scrapy check`, `parse`...: no task
            raise NotConfigured("a crawl of one of Scrapy's commands stores nothing")
        config = StoreConfig.from_settings(crawler.settings)
        check_store_uri(config.uri)
        stages = build_component_list(crawler.settings.getwithbase("ITEM_PIPELINES"))
        last = bool(stages) and load_object(stages[-1]) is cls
        pipeline = cls(config, crawler.stats, last_stage=last, on_outage=OutageStop(crawler),
                       feed=FeedConfig.from_settings(crawler.settings))
        pipeline._crawler = crawler  # the spider's name, known once it opens (see open_spider)
        return pipeline

    # -- life cycle ---------------------------------------------------------------------

    def open_spider(self) -> None:
        if self._default_site_id is None and self._crawler is not None:
            # The instance's: a spider may set its name in __init__, not on its class.
            self._default_site_id = getattr(self._crawler.spider, "name", None)
        self._commits.open()

    async def close_spider(self) -> None:
        await self._commits.close()

    # -- items --------------------------------------------------------------------------

    async def process_item(self, item: Any) -> Any:
        # Errors raised here reach Scrapy's item_error signal, where the scheduler marks the
        # task failed (not acked); no need to call Scrape.fail as well.
        if not is_item(item):
            # As stock Scrapy: a callback's str or object() is "scraped" (a feed exporter logs
            # an error for it and goes on); there is nothing to store and no task to fail. A
            # warning, not an error: Scrapy itself logs nothing for it without a feed.
            logger.warning("Not an item, not stored: %s yielded %r", _origin(), item)
            if self.stats is not None:
                self.stats.inc_value("meteorseed/items/not_an_item")
            return item
        scrape = current_scrape()
        output = current_output()
        doc, content = item_document(item, scrape, self._default_site_id, output)
        on_commit = None
        if scrape is not None:
            on_commit = partial(_committed, scrape, doc, content,
                                output if self._last_stage and output is not None
                                and output.scrape is scrape else None, self._feed_mode)
        error = await self._commits.submit(doc, on_commit)
        if error is not None:
            raise StoreWriteError(f"document {doc['_id']!r} was not committed: {error}") from error
        return item


def _origin() -> str:
    scrape = current_scrape()
    return f"task {scrape.task.task_id} ({scrape.task.url})" if scrape is not None else "spider"


def _committed(scrape: Scrape, doc: dict[str, Any], content: str, output: Output | None,
               feed_mode: str) -> None:
    # Run by the committer as soon as the document is committed: the task may be acked from
    # here, without waiting for this stage's own coroutine to resume. Its feed entry goes with
    # that ack, before it (queue/consume/items_feed.py).
    scrape.record_commit(doc["_id"], content)
    if feed_mode != "off":
        scrape.feed.append(feed_entry(doc, feed_mode, utc_timestamp()))
    if output is not None:
        output.done()


__all__ = ["StoreWriteError", "UpsertPipeline"]

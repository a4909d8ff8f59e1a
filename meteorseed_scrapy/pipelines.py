"""The store stage: upsert every item, and let it pass only once it is durably committed.

Enable it as the last item pipeline stage::

    ITEM_PIPELINES = {"meteorseed_scrapy.pipelines.UpsertPipeline": 900}

Scrapy sends ``item_scraped`` only after every stage finished, so "item scraped" means
"committed", and the scheduler acks a task only when all of its items got that far.

- Which task an item belongs to comes from :func:`meteorseed_scrapy.context.current_scrape`.
  ``unique_key`` is the item's ``unique_key`` field (kept among the stored fields), else the
  SHA-256 of the task's canonical URL; a second item without ``unique_key`` from one scrape
  raises :class:`UniqueKeyError`.
- Without the MeteorSeed scheduler (no current scrape) the item itself must say where it
  belongs: ``site_id`` (else the spider's name), ``url``, and ``unique_key`` or at least ``url``
  (the key is then the SHA-256 of the item's canonical ``url``). ``seed_id`` / ``task_id`` are
  taken from the item when present, else stored as null.
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

import asyncio
import logging
import random
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from itemadapter import ItemAdapter
from scrapy.exceptions import NotConfigured

from meteorseed_scrapy.context import Scrape, current_scrape
from meteorseed_scrapy.settings import StoreConfig
from meteorseed_scrapy.stores import (
    DocumentError,
    Store,
    StoreUnavailable,
    build_document,
    canonical_json,
    check_fields,
    check_store_uri,
    check_unique_key,
    open_store,
)
from meteorseed_scrapy.tasks import url_fingerprint

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
BACKOFF_FIRST = 0.1
BACKOFF_CAP = 5.0
STATS_PREFIX = "meteorseed/store/"


class UniqueKeyError(ValueError):
    """An item cannot be given a document key (not a DropItem: its task must not be acked)."""


class StoreWriteError(RuntimeError):
    """An item was not committed; its task stays un-acked and will be delivered again."""


@dataclass(eq=False)
class _Batch:
    future: asyncio.Future[list[BaseException | None]]
    docs: list[dict[str, Any]] = field(default_factory=list)
    #: Loop time after which a failing batch gives up; set at its first failure.
    deadline: float | None = None


class UpsertPipeline:
    def __init__(
        self,
        config: StoreConfig,
        stats: StatsCollector | None = None,
        *,
        store_factory: Callable[[str], Store] = open_store,
        default_site_id: str | None = None,
    ) -> None:
        self.config = config
        self.stats = stats
        self._store_factory = store_factory
        self._default_site_id = default_site_id
        self._store: Store | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._open_batch: _Batch | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sealed: deque[_Batch] = deque()
        self._committer: asyncio.Task[None] | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> UpsertPipeline:
        try:
            config = StoreConfig.from_settings(crawler.settings)
        except NotConfigured as exc:
            # NotConfigured would quietly disable this stage: items would pass uncommitted and
            # their tasks be acked. A bad setting must stop the crawl instead.
            raise ValueError(str(exc)) from None
        check_store_uri(config.uri)
        return cls(config, crawler.stats, default_site_id=crawler.spidercls.name)

    # -- life cycle ---------------------------------------------------------------------

    def open_spider(self) -> None:
        self._ensure_open()

    def _ensure_open(self) -> tuple[Store, ThreadPoolExecutor]:
        if self._store is None or self._executor is None:
            # One thread: the store's connection lives there and batches stay in order.
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="meteorseed-store")
            self._store = self._store_factory(self.config.uri)  # connects lazily, on first write
        return self._store, self._executor

    async def close_spider(self) -> None:
        self._seal()
        while self._committer is not None and not self._committer.done():
            await self._committer
        store, executor = self._store, self._executor
        self._store = self._executor = None
        if store is not None and executor is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(executor, store.close)
            finally:
                executor.shutdown(wait=True)

    # -- items --------------------------------------------------------------------------

    async def process_item(self, item: Any) -> Any:
        # Errors raised here reach Scrapy's item_error signal, where the scheduler marks the
        # task failed (not acked); no need to call Scrape.fail as well.
        scrape = current_scrape()
        doc, content = self._document(item, scrape)
        error = await self._submit(doc)
        if error is not None:
            raise StoreWriteError(f"document {doc['_id']!r} was not committed: {error}") from error
        if scrape is not None:
            scrape.record_commit(doc["_id"], content)
        return item

    def _document(self, item: Any, scrape: Scrape | None) -> tuple[dict[str, Any], str]:
        fields = check_fields(ItemAdapter(item).asdict())
        origin: dict[str, Any]  # site_id, url, seed_id, task_id of the document
        if scrape is not None:
            task = scrape.task
            origin = {"site_id": task.site_id, "url": task.url, "seed_id": task.seed_id,
                      "task_id": task.task_id}  # fmt: skip
        else:
            origin = {name: fields.get(name) for name in ("site_id", "url", "seed_id", "task_id")}
            origin["site_id"] = origin["site_id"] or self._default_site_id
            if not isinstance(origin["site_id"], str) or not origin["site_id"]:
                raise DocumentError("site_id", f"must be a non-empty string: {origin['site_id']!r}")
        keyless = "unique_key" not in fields
        if not keyless:
            unique_key = check_unique_key(fields["unique_key"])
        elif scrape is not None:
            if scrape.keyless_items:
                raise UniqueKeyError(
                    f"task {scrape.task.task_id} ({scrape.task.url}) yielded more than one item"
                    " without a 'unique_key' field; they would overwrite each other: give each"
                    " item a distinct unique_key"
                )
            unique_key = url_fingerprint(scrape.task.url)
        elif isinstance(origin["url"], str) and origin["url"]:
            unique_key = url_fingerprint(origin["url"])
        else:
            raise UniqueKeyError(
                "item has neither a 'unique_key' nor a 'url' field, and no MeteorSeed task"
                " is running: give it a unique_key"
            )
        doc = build_document(fields, unique_key=unique_key, **origin)
        if keyless and scrape is not None:
            scrape.keyless_items += 1  # counted once the item is known to be storable
        return doc, canonical_json(fields)

    # -- batching -----------------------------------------------------------------------

    async def _submit(self, doc: dict[str, Any]) -> BaseException | None:
        """Add ``doc`` to the open batch; its error once the batch is settled (None: committed)."""
        self._ensure_open()
        loop = asyncio.get_running_loop()
        batch = self._open_batch
        idle = self._committer is None or self._committer.done()
        if batch is None:
            batch = self._open_batch = _Batch(loop.create_future())
            if idle and self.config.batch_wait > 0:
                self._timer = loop.call_later(self.config.batch_wait, self._seal)
        index = len(batch.docs)
        batch.docs.append(doc)
        # Group commit: an idle store writes at once; while a write is running, items gather
        # and the commit loop writes them together as soon as it is done.
        if len(batch.docs) >= self.config.batch_size or (idle and self._timer is None):
            self._seal()
        # shield: one cancelled item must not cancel the write its batch-mates wait for.
        outcome = await asyncio.shield(batch.future)
        return outcome[index]

    def _seal(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._open_batch = self._open_batch, None
        if batch is None or not batch.docs:
            return
        self._sealed.append(batch)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.get_running_loop().create_task(self._commit_loop())

    async def _in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        _, executor = self._ensure_open()
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    async def _commit_loop(self) -> None:
        """Write sealed batches one after another, in order, until none is left."""
        loop = asyncio.get_running_loop()
        attempt = 0  # failed attempts since the last successful write
        try:
            while self._sealed or (self._open_batch is not None and self._open_batch.docs):
                if not self._sealed:
                    self._seal()  # what gathered during the last write goes next
                    continue
                store, _ = self._ensure_open()
                batch = self._sealed[0]
                try:
                    await self._in_thread(store.upsert_many, batch.docs)
                except StoreUnavailable as exc:
                    attempt += 1
                    await self._after_outage(exc, attempt, loop.time())
                    continue
                except Exception as exc:
                    self._sealed.popleft()
                    logger.warning(
                        "Store refused a batch of %d documents (%s); writing them one by one"
                        " to find the culprit",
                        len(batch.docs),
                        exc,
                    )
                    await self._commit_one_by_one(store, batch)
                    continue
                self._sealed.popleft()
                if attempt:
                    logger.info("Store is available again after %d retries", attempt)
                    attempt = 0
                self._settle([batch], None)
                self._inc("batches")
                self._inc("committed", len(batch.docs))
        finally:
            # Only reached with batches left when cancelled (loop shutting down): nobody may
            # wait forever for a batch that will not be written.
            unsettled = list(self._sealed)
            self._sealed.clear()
            self._settle(unsettled, StoreUnavailable("the store stage was stopped"))

    async def _after_outage(self, exc: StoreUnavailable, attempt: int, now: float) -> None:
        """Give up on batches past their deadline; back off before retrying the others.

        Every waiting batch shares the outage: its retry window starts at the first failed
        attempt it waited through, so a long queue does not wait ``retry_max`` per batch.
        """
        for batch in self._sealed:
            if batch.deadline is None:
                batch.deadline = now + self.config.retry_max
        expired: list[_Batch] = []
        while self._sealed and (self._sealed[0].deadline or now) <= now:
            expired.append(self._sealed.popleft())  # deadlines grow along the queue
        if expired:
            logger.error(
                "Store unavailable for %.1f s, giving up on %d items (their tasks will be"
                " delivered again): %s",
                self.config.retry_max,
                sum(len(batch.docs) for batch in expired),
                exc,
            )
            self._settle(expired, exc)
        if not self._sealed:
            return
        delay = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        # Never sleep past the next deadline: the last attempt happens right at it.
        delay = max(0.0, min(delay, (self._sealed[0].deadline or now) - now))
        logger.warning(
            "Store unavailable (attempt %d, %d items waiting), retrying in %.2f s: %s",
            attempt,
            sum(len(batch.docs) for batch in self._sealed),
            delay,
            exc,
        )
        self._inc("retries")
        await asyncio.sleep(delay)

    async def _commit_one_by_one(self, store: Store, batch: _Batch) -> None:
        # Any failure now is charged to the one document (even an outage starting right now):
        # its task is redelivered, so nothing is lost, and the rest of the batch goes through.
        outcome: list[BaseException | None] = []
        for doc in batch.docs:
            try:
                await self._in_thread(store.upsert_many, [doc])
            except Exception as exc:
                logger.error("Store refused document %r: %s", doc["_id"], exc)
                outcome.append(exc)
                self._inc("failed")
            else:
                outcome.append(None)
                self._inc("committed")
        self._inc("batches")
        if not batch.future.done():
            batch.future.set_result(outcome)

    def _settle(self, batches: list[_Batch], error: BaseException | None) -> None:
        for batch in batches:
            if not batch.future.done():
                batch.future.set_result([error] * len(batch.docs))
                if error is not None:
                    self._inc("failed", len(batch.docs))

    def _inc(self, name: str, count: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(STATS_PREFIX + name, count)

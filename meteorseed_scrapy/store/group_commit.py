"""Group commit of documents to a store, in one dedicated thread, in order, with retries.

See :mod:`meteorseed_scrapy.pipelines` (the store stage that uses it) for the batching, backoff
and give-up rules.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from meteorseed_scrapy.settings import StoreConfig
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.base import Store, StoreUnavailable
from meteorseed_scrapy.store.outage import OutageRetries
from meteorseed_scrapy.store.retention import bind

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
STATS_PREFIX = "meteorseed/store/"


@dataclass(eq=False)
class CommitBatch:
    docs: list[dict[str, Any]] = field(default_factory=list)
    #: One future per document, in order: its error, or None once committed. Each submitter
    #: awaits its own, so cancelling one never cancels its batch-mates' write (and needs no
    #: asyncio.shield, which cost every item one more turn of the event loop).
    waiters: list[asyncio.Future[BaseException | None]] = field(default_factory=list)
    #: Per document, what its submitter runs the moment it is committed (or None).
    hooks: list[Callable[[], None] | None] = field(default_factory=list)
    #: Loop time after which a failing batch gives up; set at its first failure.
    deadline: float | None = None
    #: The batch's first write, started in the store thread the moment it was sealed (the
    #: commit loop's first step comes a turn of the event loop later).
    write: asyncio.Future[None] | None = None


class GroupCommitter:
    """Documents in, one future each out: batches of ``config.batch_size`` documents or
    ``config.batch_wait`` seconds, written one after another by one thread."""

    def __init__(self, config: StoreConfig, stats: StatsCollector | None = None,
                 store_factory: Callable[[str], Store] = open_store,
                 on_outage: Callable[[StoreUnavailable], None] | None = None) -> None:
        self.config = config
        self.stats = stats
        self._store_factory = store_factory
        self._store: Store | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._open_batch: CommitBatch | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sealed: deque[CommitBatch] = deque()
        self._committer: asyncio.Task[None] | None = None
        #: ``on_outage``: told when an outage made items give up (:mod:`.outage`).
        self._outage = OutageRetries(self._sealed, config.retry_max, on_outage, self._settle,
                                     self._inc, logger)

    def open(self) -> None:
        self._ensure_open()

    def _ensure_open(self) -> tuple[Store, ThreadPoolExecutor]:
        if self._store is None or self._executor is None:
            # One thread: the store's connection lives there and batches stay in order.
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="meteorseed-store")
            self._store = bind(self._store_factory(self.config.uri),  # connects lazily
                               self.config.namespace, self.config.retention)
        return self._store, self._executor

    async def close(self) -> None:
        """Write what is waiting, then close the store and its thread."""
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

    async def submit(self, doc: dict[str, Any],
                     on_commit: Callable[[], None] | None = None) -> BaseException | None:
        """Add ``doc`` to the open batch; its error once the batch is settled (None: committed).

        ``on_commit`` runs on the event loop as soon as ``doc`` is known committed, in the
        callback that learns it: the submitter itself resumes a turn or two of a busy loop
        later (the store stage lets a task be acked from there)."""
        self._ensure_open()
        loop = asyncio.get_running_loop()
        batch = self._open_batch
        idle = self._committer is None or self._committer.done()
        if batch is None:
            batch = self._open_batch = CommitBatch()
            if idle and self.config.batch_wait > 0:
                self._timer = loop.call_later(self.config.batch_wait, self._seal)
        waiter: asyncio.Future[BaseException | None] = loop.create_future()
        batch.docs.append(doc)
        batch.waiters.append(waiter)
        batch.hooks.append(on_commit)
        # Group commit: an idle store writes at once; while a write is running, items gather
        # and the commit loop writes them together as soon as it is done.
        if len(batch.docs) >= self.config.batch_size or (idle and self._timer is None):
            self._seal()
        return await waiter

    def _seal(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._open_batch = self._open_batch, None
        if batch is None or not batch.docs:
            return
        self._sealed.append(batch)
        if self._committer is None or self._committer.done():
            self._start_write(batch)
            self._committer = asyncio.get_running_loop().create_task(self._commit_loop())

    def _start_write(self, batch: CommitBatch) -> None:
        store, executor = self._ensure_open()
        batch.write = asyncio.get_running_loop().run_in_executor(
            executor, store.upsert_unconfirmed, batch.docs)

    def _start_next(self) -> None:
        """(In the commit loop, after a write.) Start the next batch's write in the store
        thread now: what gathered during the last write, unless a sealed batch is first."""
        if not self._sealed:
            self._seal()  # (the commit loop runs: sealing leaves the write to this)
        if self._sealed and self._sealed[0].write is None:
            self._start_write(self._sealed[0])

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
                write, batch.write = batch.write, None
                try:
                    if write is None:
                        write = loop.run_in_executor(self._ensure_open()[1],
                                                     store.upsert_unconfirmed, batch.docs)
                    await self._outage.until_written(write, store)
                    store.confirm_written()
                except StoreUnavailable as exc:
                    attempt += 1
                    if self._outage.stopped(store):
                        self._outage.give_up_stopping(exc)
                        continue
                    await self._outage.after_outage(exc, attempt, loop.time(), store)
                    continue
                except Exception as exc:
                    self._sealed.popleft()
                    logger.warning(
                        "Store refused a batch of %d documents (%s); writing them one by one"
                        " to find the culprit",
                        len(batch.docs),
                        exc,
                    )
                    rest = await self._commit_one_by_one(store, batch)
                    if rest is not None:  # an outage began: the rest waits it out, unblamed
                        self._sealed.appendleft(rest)
                    continue
                self._sealed.popleft()
                if attempt:
                    logger.info("Store is available again after %d retries", attempt)
                    attempt = 0
                    self._outage.gave_up = False
                # The next write first, then the waiters of this one: what they run when told
                # (a task's settling, its ack) must not hold up the store thread.
                self._start_next()
                self._settle([batch], None)
                self._inc("batches")
                self._inc("committed", len(batch.docs))
        finally:
            # Only reached with batches left when cancelled (loop shutting down): nobody may
            # wait forever for a batch that will not be written.
            unsettled = list(self._sealed)
            self._sealed.clear()
            for batch in unsettled:
                if batch.write is not None:  # (its outcome is nobody's now: not logged)
                    batch.write.add_done_callback(_quiet)
            self._settle(unsettled, StoreUnavailable("the store stage was stopped"))

    async def _commit_one_by_one(self, store: Store, batch: CommitBatch) -> CommitBatch | None:
        """Write ``batch`` a document at a time: a refused one fails alone. An outage is
        nobody's fault: the documents from there on are returned, as a batch to retry."""
        outcome: list[BaseException | None] = []
        for doc in batch.docs:
            try:
                await self._in_thread(store.upsert_many, [doc])
            except StoreUnavailable:
                done = len(outcome)
                rest = CommitBatch(batch.docs[done:], batch.waiters[done:], batch.hooks[done:])
                batch.docs, batch.waiters, batch.hooks = (
                    batch.docs[:done], batch.waiters[:done], batch.hooks[:done])
                self._resolve(batch, outcome)
                return rest
            except Exception as exc:
                logger.error("Store refused document %r: %s", doc["_id"], exc)
                outcome.append(exc)
                self._inc("failed")
            else:
                outcome.append(None)
                self._inc("committed")
        self._inc("batches")
        self._resolve(batch, outcome)
        return None

    def _settle(self, batches: list[CommitBatch], error: BaseException | None) -> None:
        for batch in batches:
            self._resolve(batch, [error] * len(batch.docs))
            if error is not None:
                self._inc("failed", len(batch.docs))

    @staticmethod
    def _resolve(batch: CommitBatch, outcome: list[BaseException | None]) -> None:
        for doc, waiter, hook, error in zip(batch.docs, batch.waiters, batch.hooks, outcome,
                                            strict=True):
            if waiter.done():  # (a cancelled submitter: its item is not through)
                continue
            if error is None and hook is not None:
                try:
                    hook()
                except Exception:  # (the submitter's bug: its batch-mates still hear theirs)
                    logger.exception("Error in the commit hook of document %r", doc.get("_id"))
            waiter.set_result(error)

    def _inc(self, name: str, count: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(STATS_PREFIX + name, count)


def _quiet(write: asyncio.Future[None]) -> None:
    if not write.cancelled():
        write.exception()


__all__ = ["STATS_PREFIX", "CommitBatch", "GroupCommitter"]

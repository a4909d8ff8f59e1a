"""Group commit of documents to a store, in one dedicated thread, in order, with retries.

See :mod:`meteorseed_scrapy.pipelines` (the store stage that uses it) for the batching, backoff
and give-up rules.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from meteorseed_scrapy.settings import StoreConfig
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.base import Store, StoreUnavailable

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

# Logged under the store stage's name, as before this was split out of it.
logger = logging.getLogger(__name__)

_T = TypeVar("_T")
BACKOFF_FIRST = 0.1
BACKOFF_CAP = 5.0
STATS_PREFIX = "meteorseed/store/"


@dataclass(eq=False)
class _Batch:
    #: Its place in the order of writes (one more than the batch before it).
    seq: int
    docs: list[dict[str, Any]] = field(default_factory=list)
    #: One future per document, in order: its error, or None once committed. Each submitter
    #: awaits its own, so cancelling one never cancels its batch-mates' write (and needs no
    #: asyncio.shield, which cost every item one more turn of the event loop).
    waiters: list[asyncio.Future[BaseException | None]] = field(default_factory=list)
    #: Per document, what its submitter runs the moment it is committed (or None).
    hooks: list[Callable[[], None] | None] = field(default_factory=list)
    #: Takes no more documents: full, or the store thread started writing it.
    closed: bool = False
    #: Loop time after which a failing batch gives up; set at its first failure.
    deadline: float | None = None
    #: Its first write, queued in the store thread as soon as the batch exists (after
    #: ``batch_wait`` on an idle store): True written, False skipped since a batch before it
    #: was not settled yet (the commit loop then writes it, in order).
    write: asyncio.Future[bool] | None = None


class GroupCommitter:
    """Documents in, one future each out: batches of ``config.batch_size`` documents or
    ``config.batch_wait`` seconds, written one after another by one thread.

    Group commit without a turn of the event loop between writes: a batch's first write is
    queued in the store thread when its first document comes, and closes the batch when the
    thread gets to it, right after the write before it; whatever came meanwhile goes in it.
    Failures and retries are the commit loop's, on the event loop, one batch at a time.
    """

    def __init__(self, config: StoreConfig, stats: StatsCollector | None = None,
                 store_factory: Callable[[str], Store] = open_store) -> None:
        self.config = config
        self.stats = stats
        self._store_factory = store_factory
        self._store: Store | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._queue: deque[_Batch] = deque()  # not settled, in order; the last may be open
        self._next_seq = 1
        # Shared with the store thread: the open batch closes under it, and a batch's first
        # write goes only once every batch before it is settled (seq ``_settled + 1``).
        self._lock = threading.Lock()
        self._settled = 0
        self._timer: asyncio.TimerHandle | None = None
        self._committer: asyncio.Task[None] | None = None

    def open(self) -> None:
        self._ensure_open()

    def _ensure_open(self) -> tuple[Store, ThreadPoolExecutor]:
        if self._store is None or self._executor is None:
            # One thread: the store's connection lives there and batches stay in order.
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="meteorseed-store")
            self._store = self._store_factory(self.config.uri)  # connects lazily, on first write
        return self._store, self._executor

    async def close(self) -> None:
        """Write what is waiting, then close the store and its thread."""
        if self._timer is not None:  # (an idle store gathering a batch: write it now)
            self._timer.cancel()
            self._timer = None
            self._start(self._queue[-1])
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
        waiter: asyncio.Future[BaseException | None] = loop.create_future()
        with self._lock:
            batch = self._queue[-1] if self._queue and not self._queue[-1].closed else None
            new = batch is None
            if batch is None:
                batch = _Batch(self._next_seq)
                self._next_seq += 1
                self._queue.append(batch)
            batch.docs.append(doc)
            batch.waiters.append(waiter)
            batch.hooks.append(on_commit)
            if len(batch.docs) >= self.config.batch_size:
                batch.closed = True
        if new:
            if len(self._queue) == 1 and self.config.batch_wait > 0 and not batch.closed:
                # An idle store waits batch_wait for more; a busy one gathers during its write.
                self._timer = loop.call_later(self.config.batch_wait, self._waited, batch)
            else:
                self._start(batch)
        elif batch.closed and self._timer is not None:
            self._waited(batch)  # full before its wait was over
        return await waiter

    def _waited(self, batch: _Batch) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._start(batch)

    def _start(self, batch: _Batch) -> None:
        """Queue ``batch``'s first write in the store thread; make sure the commit loop runs."""
        loop = asyncio.get_running_loop()
        _, executor = self._ensure_open()
        batch.write = loop.run_in_executor(executor, self._first_write, batch)
        if self._committer is None or self._committer.done():
            self._committer = loop.create_task(self._commit_loop())

    def _first_write(self, batch: _Batch) -> bool:
        """(In the store thread.) Close ``batch`` and write it, unless a batch before it is
        not settled yet (a failed write the commit loop is still dealing with)."""
        with self._lock:
            batch.closed = True
            if batch.seq != self._settled + 1:
                return False
        self._write(batch)
        return True

    def _write(self, batch: _Batch) -> None:
        """(In the store thread.) Write ``batch``; written, it is settled for the order."""
        store, _ = self._ensure_open()
        store.upsert_many(batch.docs)
        self._settled_up_to(batch)

    def _settled_up_to(self, batch: _Batch) -> None:
        with self._lock:
            self._settled = max(self._settled, batch.seq)

    async def _in_thread(self, fn: Callable[..., _T], *args: Any) -> _T:
        _, executor = self._ensure_open()
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    async def _commit_loop(self) -> None:
        """Settle batches one after another, in order, until none is left to write."""
        loop = asyncio.get_running_loop()
        attempt = 0  # failed attempts since the last successful write
        try:
            while self._queue and (self._queue[0].write is not None or self._queue[0].closed):
                batch = self._queue[0]
                write, batch.write = batch.write, None
                try:
                    if write is None or not await write:  # a retry, or its turn was skipped
                        with self._lock:
                            batch.closed = True
                        await self._in_thread(self._write, batch)
                except StoreUnavailable as exc:
                    attempt += 1
                    await self._after_outage(exc, attempt, loop.time())
                    continue
                except Exception as exc:
                    self._queue.popleft()
                    logger.warning(
                        "Store refused a batch of %d documents (%s); writing them one by one"
                        " to find the culprit",
                        len(batch.docs),
                        exc,
                    )
                    await self._commit_one_by_one(batch)
                    continue
                self._queue.popleft()
                if attempt:
                    logger.info("Store is available again after %d retries", attempt)
                    attempt = 0
                self._settle([batch], None)
                self._inc("batches")
                self._inc("committed", len(batch.docs))
        finally:
            if self._queue and (self._queue[0].write is not None or self._queue[0].closed):
                # Only when cancelled (loop shutting down): nobody may wait forever for a
                # batch that will not be written.
                unsettled = list(self._queue)
                self._queue.clear()
                for batch in unsettled:
                    if batch.write is not None:  # (its outcome is nobody's now: not logged)
                        batch.write.add_done_callback(_quiet)
                self._settle(unsettled, StoreUnavailable("the store stage was stopped"))

    async def _after_outage(self, exc: StoreUnavailable, attempt: int, now: float) -> None:
        """Give up on batches past their deadline; back off before retrying the others.

        Every waiting batch shares the outage: its retry window starts at the first failed
        attempt it waited through, so a long queue does not wait ``retry_max`` per batch.
        """
        for batch in self._queue:
            if batch.deadline is None:
                batch.deadline = now + self.config.retry_max
        expired: list[_Batch] = []
        while self._queue and (self._queue[0].deadline or now) <= now:
            expired.append(self._queue.popleft())  # deadlines grow along the queue
            self._settled_up_to(expired[-1])
        if expired:
            logger.error(
                "Store unavailable for %.1f s, giving up on %d items (their tasks will be"
                " delivered again): %s",
                self.config.retry_max,
                sum(len(batch.docs) for batch in expired),
                exc,
            )
            self._settle(expired, exc)
        if not self._queue:
            return
        delay = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        # Never sleep past the next deadline: the last attempt happens right at it.
        delay = max(0.0, min(delay, (self._queue[0].deadline or now) - now))
        logger.warning(
            "Store unavailable (attempt %d, %d items waiting), retrying in %.2f s: %s",
            attempt,
            sum(len(batch.docs) for batch in self._queue),
            delay,
            exc,
        )
        self._inc("retries")
        await asyncio.sleep(delay)

    async def _commit_one_by_one(self, batch: _Batch) -> None:
        # Any failure now is charged to the one document (even an outage starting right now):
        # its task is redelivered, so nothing is lost, and the rest of the batch goes through.
        store, _ = self._ensure_open()
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
        self._settled_up_to(batch)
        self._resolve(batch, outcome)

    def _settle(self, batches: list[_Batch], error: BaseException | None) -> None:
        for batch in batches:
            self._resolve(batch, [error] * len(batch.docs))
            if error is not None:
                self._inc("failed", len(batch.docs))

    @staticmethod
    def _resolve(batch: _Batch, outcome: list[BaseException | None]) -> None:
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


def _quiet(write: asyncio.Future[Any]) -> None:
    if not write.cancelled():
        write.exception()


__all__ = ["BACKOFF_CAP", "BACKOFF_FIRST", "STATS_PREFIX", "GroupCommitter"]

"""A store outage: how the group committer lives through it (:class:`OutageRetries`), and a
worker that cannot go on safely stops, leaving its tasks pending.

:class:`OutageRetries`: a batch the store could not write is retried with backoff, every
waiting batch sharing the outage, for ``METEORSEED_STORE_RETRY_MAX``; then its items give up
(not acked) and the handler is told, once per outage. A crawl that is stopping gives up at once.

:class:`CrawlStop` closes the spider with a reason and makes ``scrapy crawl`` exit 1, after one
error line and a stat. :class:`OutageStop` is the store stage's: an outage that outlasts
``METEORSEED_STORE_RETRY_MAX`` (full disk, read-only file, lost connection, refused credentials),
or a store lost outright (its SQLite file deleted or replaced), makes the store stage give up the
items it holds: their tasks are not acked. Taking more tasks would fail each of them the same
way, and every failure uses up a delivery until the task is dead-lettered, although nothing is
wrong with it. So the worker stops at once (reason :data:`REASON`, stat
``meteorseed/store/outage_stop``). Its tasks stay pending (unstarted ones are handed back, their
delivery not counted) for a worker whose store works, or for this one once restarted.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy import signals

from meteorseed_scrapy.backoff import exponential
from meteorseed_scrapy.store.base import Store, StoreLost, StoreUnavailable

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from meteorseed_scrapy.store.group_commit import CommitBatch

logger = logging.getLogger(__name__)

REASON = "meteorseed_store_unavailable"
BACKOFF_FIRST = 0.1
BACKOFF_CAP = 5.0
#: How often a slow write, or a wait before a retry, looks whether the crawl is stopping.
STOP_POLL = 0.25


def _never() -> bool:
    return False


class OutageRetries:
    """The group committer's outage rules, over its queue of ``sealed`` batches: ``settle``
    resolves batches with an error, ``count`` adds to a store stat, ``log`` is the
    committer's logger (the lines are the store stage's)."""

    def __init__(self, sealed: deque[CommitBatch], retry_max: float,
                 on_outage: Callable[[StoreUnavailable], None] | None,
                 settle: Callable[[list[CommitBatch], BaseException | None], None],
                 count: Callable[[str], None], log: logging.Logger) -> None:
        self._sealed, self._retry_max, self._settle, self._count = sealed, retry_max, settle, count
        self._log = log
        #: Told when an outage made items give up (past ``retry_max``, or the store lost):
        #: the worker stops rather than fail task after task on a store that is not there.
        self._on_outage = on_outage
        self.gave_up = False  # during this outage (said once per outage)
        #: Whether the crawl is being stopped (the outage handler knows its crawler): an
        #: outage then fails what waits at once instead of retrying for ``retry_max``.
        self._crawl_stopping: Callable[[], bool] = getattr(on_outage, "stopping", _never)
        self.stopping = False

    async def until_written(self, write: asyncio.Future[None], store: Store) -> None:
        """``write``'s outcome; while it lasts, a stopping crawl tells the store not to wait
        for a lock held elsewhere (the write then fails within moments)."""
        if not write.done():
            # Awaited directly, the poll on a timer beside it: asyncio.wait would cost the
            # commit a further turn of the event loop, a long one on a busy worker.
            loop = asyncio.get_running_loop()
            poll: list[asyncio.TimerHandle] = []  # (the one now due)

            def check() -> None:
                self.stopped(store)
                poll[0] = loop.call_later(STOP_POLL, check)

            poll.append(loop.call_later(STOP_POLL, check))
            try:
                await write
            finally:
                poll[0].cancel()
                self.stopped(store)
        write.result()

    def stopped(self, store: Store) -> bool:
        if not self.stopping and self._crawl_stopping():
            self.stopping = True
            store.stop_waiting()
        return self.stopping

    def give_up_stopping(self, exc: StoreUnavailable) -> None:
        """The crawl is stopping during an outage: what waits fails now, in one line."""
        expired = list(self._sealed)
        self._sealed.clear()
        if not self.gave_up:
            self._log.warning(
                "Store unavailable while this worker stops: %d items not written, not"
                " retried (their tasks stay pending for the next worker): %s",
                sum(len(batch.docs) for batch in expired), exc)
        self.gave_up = True
        self._settle(expired, exc)

    async def after_outage(self, exc: StoreUnavailable, attempt: int, now: float,
                           store: Store) -> None:
        """Give up on batches past their deadline; back off before retrying the others.

        Every waiting batch shares the outage: its retry window starts at the first failed
        attempt it waited through, so a long queue does not wait ``retry_max`` per batch.
        """
        sealed = self._sealed
        for batch in sealed:
            if batch.deadline is None:
                batch.deadline = now + self._retry_max
        expired: list[CommitBatch] = []
        lost = isinstance(exc, StoreLost)  # retrying cannot help: everything gives up now
        while sealed and (lost or (sealed[0].deadline or now) <= now):
            expired.append(sealed.popleft())  # deadlines grow along the queue
        if expired:
            # (Said once; by the handler told below, when there is one: the worker stops.)
            quiet = self.gave_up or self._on_outage is not None
            (self._log.debug if quiet else self._log.error)(
                "Store %s, giving up on %d items (not acked: their tasks stay pending): %s",
                "lost" if lost else f"unavailable for {self._retry_max:.1f} s",
                sum(len(batch.docs) for batch in expired),
                exc,
            )
            self._settle(expired, exc)
            if self._on_outage is not None and not self.gave_up:
                self._on_outage(exc)
            self.gave_up = True
        if not sealed:
            return
        delay = exponential(attempt - 1, BACKOFF_FIRST, BACKOFF_CAP, jitter=(0.5, 1.0))
        # Never sleep past the next deadline: the last attempt happens right at it.
        delay = max(0.0, min(delay, (sealed[0].deadline or now) - now))
        # One line per outage; its retries are counted (meteorseed/store/retries).
        if attempt == 1:
            self._count("outages")
        (self._log.warning if attempt == 1 else self._log.debug)(
            "Store unavailable (attempt %d, %d items waiting), retrying in %.2f s for up to"
            " %.1f s: %s",
            attempt, sum(len(batch.docs) for batch in sealed), delay, self._retry_max, exc)
        self._count("retries")
        end = asyncio.get_running_loop().time() + delay
        while not self.stopping:  # (a stop ends the wait: the next attempt fails fast)
            left = end - asyncio.get_running_loop().time()
            if left <= 0:
                break
            await asyncio.sleep(min(left, STOP_POLL))
            self.stopped(store)


class CrawlStop:
    """Stops the crawl once, for good: ``stop(message)`` logs ``message`` as an error, sets the
    stat ``stat`` to 1 and closes the spider with ``reason``; ``scrapy crawl`` exits 1, or
    ``exit_code`` when one is given (the process exits with it once the engine stopped)."""

    def __init__(self, crawler: Crawler, reason: str, stat: str,
                 log: logging.Logger = logger, exit_code: int | None = None) -> None:
        self.crawler = crawler
        self.reason = reason
        self.stat = stat
        self._log = log
        self._exit_code = exit_code
        self.stopped = False
        self._closing: asyncio.Future[None] | None = None
        # weak=False: the owner (a watchdog whose loop has ended) may be gone by then.
        crawler.signals.connect(self._engine_stopped, signals.engine_stopped, weak=False)

    def stop(self, message: str) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._log.error("%s", message)
        if self.crawler.stats is not None:
            self.crawler.stats.set_value(self.stat, 1)
        try:
            engine = self.crawler.engine
        except RuntimeError:  # (no crawl running: nothing to close)
            return
        if engine is not None and engine.spider is not None:  # (None: no crawl yet, 2.14)
            self._closing = asyncio.ensure_future(engine.close_spider_async(reason=self.reason))

    def _engine_stopped(self) -> None:
        if self.stopped and self._exit_code is not None:
            asyncio.get_running_loop().call_soon(_exit, self._exit_code)
        elif self.stopped:
            # Scrapy's crawl command exits 1 only for a crawl that did not start, which it
            # tells by the crawler having no spider: the one way to make this stop non-zero.
            self.crawler.spider = None


def _exit(code: int) -> None:
    raise SystemExit(code)


class OutageStop:
    def __init__(self, crawler: Crawler) -> None:
        self._stop = CrawlStop(crawler, REASON, "meteorseed/store/outage_stop")

    def stopping(self) -> bool:
        """Whether the crawl is being stopped (SIGTERM, SIGINT, ``crawler.stop()``): the store
        stage then gives up waiting on an outage (its tasks stay pending)."""
        try:
            engine = self._stop.crawler.engine
        except RuntimeError:  # (no crawl running)
            return False
        return engine is not None and engine.spider is not None and not engine.running

    def __call__(self, exc: StoreUnavailable) -> None:
        self._stop.stop(
            f"Store {'lost' if isinstance(exc, StoreLost) else 'unavailable'}: stopping this"
            " worker; its tasks stay pending (none acked, none dead-lettered) until a worker"
            f" with a working store takes them: {exc}")


__all__ = ["BACKOFF_CAP", "BACKOFF_FIRST", "REASON", "CrawlStop", "OutageRetries", "OutageStop"]

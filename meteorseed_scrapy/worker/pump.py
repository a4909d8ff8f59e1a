"""A worker's tasks, from their delivery to their ack; the one owner of their state.

The scheduler only calls the verbs below. All network I/O runs in background loops on the
reactor's asyncio loop (so ``next_request()`` never waits for Redis): read and maintain
(:mod:`.intake`), quota (:mod:`.dispatcher`), flush (:mod:`.completions`). A task is acked only
after its final hop was scraped, every item it produced passed the store stage (which awaits
its commit), and every request it yielded is durable in the stream; how it ends is decided in
:mod:`.fate` and acted on by :mod:`.settling`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING

from scrapy import Request, Spider
from scrapy.http import Response
from twisted.python.failure import Failure

from meteorseed_scrapy.politeness.breaker import Breaker
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import SiteLimits
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.delivery import Delivery, Ref
from meteorseed_scrapy.queue.consume.task_history import TaskHistory
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.scrapy_internals import downloads_in_progress
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.task.context import Scrape, task_of
from meteorseed_scrapy.task.exceptions import TaskDeferred
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.worker.breaker_states import BreakerStates
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.dispatcher import Handout
from meteorseed_scrapy.worker.fate import WhatHappened
from meteorseed_scrapy.worker.intake import READ_BLOCK_MS, Intake
from meteorseed_scrapy.worker.keepalive import KeepAlive
from meteorseed_scrapy.worker.ledger import Entry, TaskLedger
from meteorseed_scrapy.worker.loops import Loops
from meteorseed_scrapy.worker.redis_watch import RedisWatch
from meteorseed_scrapy.worker.requests import task_to_request
from meteorseed_scrapy.worker.seed_holds import SeedHolds
from meteorseed_scrapy.worker.settling import Settling
from meteorseed_scrapy.worker.shutdown import last_writes
from meteorseed_scrapy.worker.start_pacing import StartPacing
from meteorseed_scrapy.worker.waiting import ComingTasks, WaitingTasks
from meteorseed_scrapy.worker.work_budget import WorkBudget, WorkSizes
from meteorseed_scrapy.worker.yielded import YieldedRequests

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull

logger = logging.getLogger(__name__)


class StreamPump:
    def __init__(self, crawler: Crawler, spider: Spider | None, consumer: StreamConsumer,
                 writer: TaskWriter, config: WorkerConfig, *, gate: SiteGate,
                 delayed: DelayedSet, breaker: Breaker,
                 limits_for: Callable[[str], SiteLimits], sizes: WorkSizes, politeness: bool,
                 on_change: Callable[[], None],
                 on_new_urls: Callable[[Iterable[str]], None], full: RedisFull,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stats = crawler.stats
        self._signals = crawler.signals
        self._settings = crawler.settings
        self._spider = spider
        self._consumer = consumer
        self._config = config
        self._limits_for = limits_for
        self._on_change = on_change  # work came (or stopped coming): wake the engine
        self._ledger = TaskLedger()
        self._budget = WorkBudget(self._ledger, sizes, partial(downloads_in_progress, crawler))
        # Entries read but not started, per site, by priority (realtime lane first).
        self._buffer = WaitingTasks(lambda e: consumer.lane_of(e.deliveries[0]) == "realtime")
        self._completions = Completions(
            consumer, writer, delayed, config, self._stats,
            on_child_durable=lambda parent_id: self._settling.child_durable(parent_id),
            on_new_urls=on_new_urls,
            on_children=lambda tasks, fresh: self._yielded.written(tasks, fresh),
            history=TaskHistory.from_settings(crawler.settings, consumer.redis, consumer.keys))
        self._settling = Settling(self._ledger, self._completions, breaker, crawler, spider,
                                  on_settled=lambda: self._intake.room.set(),
                                  on_parked=lambda task_id: self._pacing.started(task_id))
        self._breaker = breaker
        self._handout = Handout(  # (without politeness every task may go at once)
            self._buffer, self._budget, self._start_next, self._stats,
            gate=gate if politeness else None, limits_for=limits_for, breaker=breaker,
            on_change=on_change, park=self._settling.park, full=full)
        self._loops = Loops(consumer, self._stats, full)
        self._watch = RedisWatch(crawler, consumer, self)
        self._loops.on_refused = self._watch.refused
        self._keepalive = KeepAlive(consumer, config.redis_url, config.claim_idle)
        self._intake = Intake(consumer, delayed, self._completions, config, self._stats, self,
                              sizes.read_batch, self._keepalive, clock)
        self._pacing = StartPacing(crawler.engine, self._intake.reads, self._full)
        self._coming = ComingTasks()  # this worker's new tasks on their way through the stream
        self._yielded = YieldedRequests(crawler, spider, self._ledger, self._completions,
                                        self._pacing, self._coming,
                                        lambda: self._intake.reads_started)
        self._blocked = False  # next_request() refused for max_settling: wake the engine later
        self._seed_holds = SeedHolds(consumer, self._ledger, self._buffer, self._completions,
                                     self._stats, on_gone=self._gone)

    # -- life --------------------------------------------------------------------------------
    def start(self) -> None:
        loops = self._loops
        self._keepalive.start()
        self._pacing.install()
        self._yielded.dupes.open()
        loops.start(self._intake.read_once, "read")
        loops.start(self._intake.maintain_once, "reclaim")
        if self._config.idle_close:
            self._completions.on_fate_written = self._intake.written
            loops.start(self._intake.idle_once, "idle check")
        loops.start(self._watch.step, "eviction watch")
        loops.start(self._seed_holds.step, "seed holds")
        loops.start(self._completions.flush_once, "ack", self._completions.needed,
                    self._completions.pending)
        if self._handout.dispatcher is not None:
            quota = BreakerStates(self._handout.dispatcher.step, self._breaker, self._signals)
            loops.start(quota.step, "quota")

    async def stop(self, deadline_s: float = 15.0) -> None:
        """Stop reading, flush what is queued (within a deadline), hand back the rest, and
        leave the consumer group."""
        self._loops.stopping = True
        self._completions.closing = True
        self._intake.room.set()
        self._completions.needed.set()
        # The read and maintain loops end their step (a blocking read) before the rest stops.
        await asyncio.wait(self._loops.tasks[:2], timeout=READ_BLOCK_MS / 1000 + 2)
        await self._loops.cancel()
        # Before the hand-back: a touch after it would undo the idle time it sets.
        await asyncio.to_thread(self._keepalive.stop)
        desk = self._handout.desk
        if desk is not None:
            desk.give_back_all()
        await last_writes(
            self._completions, self._consumer, self._config, self._loops.outage, self._loops.full,
            unsettled=lambda: [d for e in self._ledger.entries() for d in e.deliveries],
            flush_permits=desk.flush if desk is not None else None,
            deadline_s=deadline_s)
        self._completions.record_ack_latency()
        self._yielded.dupes.close("finished")

    # -- what the scheduler asks -------------------------------------------------------------
    def has_work(self) -> bool:
        """Requests to hand out, or children on their way: not yet written to the stream, or
        written and not yet looked for by a read of this worker (Scrapy's scheduler has a
        request yielded by a callback at once: it must not look empty meanwhile)."""
        return bool(self._handout.hops or self._buffer or self._completions.outbox
                    or self._intake.reads_done <= self._yielded.written_mark)

    def quiet_for(self) -> float | None:
        """Seconds since nothing was left to do here and in the namespace (None: busy; only
        watched with ``METEORSEED_IDLE_CLOSE``)."""
        return self._intake.quiet_for()

    def next_request(self) -> Request | None:
        """The request to download now, holding a permit of its site (None: nothing may go)."""
        if self._loops.stopping:
            return None
        if not self._budget.may_dispatch():
            self._blocked = True
            return None
        return self._handout.next_request()

    def ahead_of(self, priority: int) -> bool:
        """A task of higher priority than ``priority`` waits here, or is on its way here
        (:class:`~.waiting.ComingTasks`): Scrapy's scheduler would serve it before a request
        of ``priority``."""
        best = max((-self._buffer.head(site)[1] for site in self._buffer.sites()), default=None)
        coming = self._coming.best()
        return any(p is not None and p > priority for p in (best, coming))

    def _start_next(self, site: str) -> Request | None:
        while True:
            entry: Entry | None = self._buffer.pop(site)
            if entry is None:
                return None
            if self._ledger.get(entry.task.task_id) is not entry:
                continue  # taken over by another worker meanwhile
            if self._seed_holds.stops(entry):
                continue  # its seed is held or cancelled
            try:
                request = task_to_request(entry.task, self._spider)
            except TaskError as exc:
                self._settling.record(entry, WhatHappened(entry.task, unusable=str(exc)))
                continue
            timeout = self._limits_for(site).timeout
            if timeout is not None:
                request.meta.setdefault("download_timeout", timeout)
            entry.started = True
            self._intake.room.set()
            self._stats.inc_value("meteorseed/started")
            self._pacing.started(entry.task.task_id)
            return request

    def hop(self, request: Request) -> bool:
        """A retry or redirect of a task held here: kept here, to go out again with a permit.
        False when this worker does not hold the request's task."""
        task = task_of(request)
        if task is None or task.task_id not in self._ledger:
            return False
        self._handout.hop(task.site_id, request)
        return True

    def child(self, scrape: Scrape | None, request: Request) -> bool:
        """A request yielded by ``scrape``'s callback (None: ``start()``): :mod:`.yielded`."""
        return self._yielded.child(scrape, request)

    def scrape_started(self, request: Request) -> Scrape | None:
        """``request``'s response (or failure) goes to the scraper: its permit comes back. The
        scrape of its task (to make current while it runs), or None when no task of ours."""
        self._handout.download_done(request)
        task = task_of(request)
        entry = self._ledger.get(task.task_id) if task is not None else None
        if entry is None:
            return None
        entry.scrape = Scrape(entry.task)
        entry.response_at = time.monotonic()
        return entry.scrape

    def finished(self, request: Request, result: Response | Failure,
                 scrape: Scrape | None = None) -> None:
        """The scrape of ``request``'s final hop (``scrape``, when known: it may end before
        Scrapy says so, and then is not ended twice) is over: every item passed the store stage
        (or the scrape says why not). The task settles once its children are durable too."""
        task = task_of(request)
        entry = self._ledger.get(task.task_id) if task is not None else None
        if entry is None or (scrape is not None and entry.scrape is not scrape):
            return
        self._settling.finished(entry, request, result)
        if self._blocked:  # a scrape finished: next_request() may hand out work again
            self._blocked = False
            self._on_change()

    def deferral_ends(self, request: Request, deferred: TaskDeferred) -> str:
        """Why ``request``'s task, deferred, is given up on now ("" while it only waits)."""
        task = task_of(request)
        if task is None:
            return ""
        return self._settling.trouble(task.site_id, deferred.delay_s, deferred.why)[0]

    def give_up_with(self, runner: Callable[[ExecTask, str], bool]) -> None:
        """``runner(task, reason)`` fails a task given up on without being sent again through
        Scrapy's scraper, so that its errback runs (then :meth:`scrape_started` and
        :meth:`finished` settle it); False when it has no errback."""
        self._settling.give_up = runner

    # -- what the loops ask (intake.Holder) --------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._loops.stopping

    def wanted(self) -> tuple[int, int]:
        return self._budget.want(), len(self._buffer)

    def book(self, delivery: Delivery, urgent: bool) -> None:
        entry = self._ledger.add(delivery)
        if entry is not None:  # (else a duplicate delivery, absorbed by the task's entry)
            self._buffer.append(entry.task.site_id, entry)  # (urgent: its lane says)
            self._coming.arrived(entry.task.task_id)
            self._handout.want_permits()
            self._pacing.booked(entry.task.task_id)

    def held_refs(self) -> list[Ref]:
        return self._ledger.refs() + self._completions.refs_in_hand()

    def lost(self, ref: Ref) -> None:
        self._ledger.forget_msg(ref)

    def locally_quiet(self) -> bool:
        return not (self._buffer or len(self._ledger) or self._completions.unsettled())

    def changed(self) -> None:
        self._on_change()

    def read_done(self) -> None:
        self._pacing.progress.set()

    def _gone(self, task_id: str) -> None:
        """A task left without starting (parked, cancelled): room for another."""
        self._pacing.started(task_id)
        self._intake.room.set()

    def _full(self) -> bool:
        """This worker holds all the tasks it may (it reads no more until one ends)."""
        return self._budget.want() <= len(self._buffer)

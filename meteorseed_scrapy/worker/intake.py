"""How tasks come in: the read loop (XREADGROUP into the worker's buffer, sized by free
capacity) and the maintain loop (the keep-alive thread's snapshot of our tasks, take-over of
dead workers' tasks, promotion of due deferred tasks) and, for a batch worker, the idle loop
(the namespace-quiet check)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from meteorseed_scrapy.queue.consume.acks import TaskRecords
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.delivery import Delivery, Ref
from meteorseed_scrapy.queue.fleet.liveness import Liveness
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.fate import Outcome, on_delivery
from meteorseed_scrapy.worker.keepalive import KeepAlive

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

READ_BLOCK_MS = 500


class Holder(Protocol):
    """The side that holds the tasks read (the pump)."""

    @property
    def stopping(self) -> bool: ...

    def wanted(self) -> tuple[int, int]:
        """(tasks worth holding now, tasks read and not started yet)."""

    def book(self, delivery: Delivery, urgent: bool) -> None: ...

    def held_refs(self) -> list[Ref]:
        """Refs of every task held and not yet acked, dead-lettered or deferred."""

    def lost(self, ref: Ref) -> None: ...

    def read_done(self) -> None:
        """A read of new tasks ended (whatever it got)."""

    def locally_quiet(self) -> bool: ...

    def changed(self) -> None: ...


class Intake:
    def __init__(self, consumer: StreamConsumer, delayed: DelayedSet, completions: Completions,
                 config: WorkerConfig, stats: StatsCollector, holder: Holder, read_batch: int,
                 keepalive: KeepAlive, clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self.task_records = TaskRecords(consumer.redis, consumer.keys)
        self.group = consumer.membership()
        self.liveness = Liveness(consumer.redis, consumer.keys, consumer.consumer,
                                 config.claim_idle)
        self.delayed = delayed
        self.completions = completions
        self.config = config
        self.stats = stats
        self.holder = holder
        self.read_batch = read_batch
        self.keepalive = keepalive  # touches held tasks from its own thread
        self.room = asyncio.Event()  # capacity came free: the read loop may fetch more
        self.clock = clock  # (monotonic) of the quiet clock
        self.quiet_since: float | None = None  # since when nothing is left in the namespace
        self._woken_for: float | None = None  # the quiet the engine was woken for, when due
        self.recheck = asyncio.Event()  # a task's fate was written here: look again at once
        self._written_at: float | None = None  # when, unless a check looked since
        # When the maintain loop next reclaims, promotes due tasks (monotonic).
        self._next_reclaim = self._next_promote = 0.0
        # The last reclaim took all it asked for: more may wait, and the read loop takes them
        # (as capacity comes free) before it reads new tasks.
        self.backlog = False
        self._taking = asyncio.Lock()
        # Reads of new tasks started and ended: a read started after a task was written and
        # ended without it says that it went to another worker.
        self.reads_started = self.reads_done = 0

    # -- read --------------------------------------------------------------------------------
    async def read_once(self) -> None:
        worth, buffered = self.holder.wanted()
        want = worth - buffered
        # While tasks are still buffered, read in batches rather than one per finished task:
        # each read costs the busy reactor a round trip.
        if want <= 0 or (buffered and want < self.read_batch):
            self.room.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.room.wait(), 0.5 if want <= 0 else 0.05)
            return
        if self.backlog or time.monotonic() >= self._next_reclaim:
            # A dead worker's tasks before new ones: they have waited already. (Checked here
            # too, not only on the maintain tick: new tasks would otherwise take every slot
            # that comes free, and a dead worker's tasks would wait for the backlog's end.)
            if await self.take_over(want):
                return
            self._next_reclaim = time.monotonic() + self._tick()
        self.reads_started += 1
        try:
            deliveries = await self.consumer.read(want, READ_BLOCK_MS)
            if self.holder.stopping:
                await self.consumer.hand_back(deliveries, idle_s=self.config.claim_idle + 3600)
                return
            if deliveries:
                self.stats.inc_value("meteorseed/read", len(deliveries))
                for lane, n in Counter(self.consumer.lane_of(d) for d in deliveries).items():
                    self.stats.inc_value(f"meteorseed/read/{lane}", n)
                await self.accept(deliveries)
        finally:
            self.reads_done += 1
            self.holder.read_done()

    def reads(self) -> tuple[int, int]:
        """(reads of new tasks started, ended)."""
        return self.reads_started, self.reads_done

    async def accept(self, deliveries: Sequence[Delivery]) -> None:
        self.quiet_since = None  # tasks came: not quiet (whenever the idle loop looks next)
        redelivered = [d for d in deliveries if d.task is not None and d.deliveries > 1]
        records = await self.task_records.completion_records(
            [d.task for d in redelivered if d.task is not None]
        )
        done = {d.ref for d, r in zip(redelivered, records, strict=True) if r}
        reasons = await self.task_records.failure_notes(
            [d.task for d in redelivered if d.task is not None
             and d.deliveries > self.config.max_deliveries]
        )
        for d in deliveries:
            verdict = on_delivery(
                (d.error or "not a task") if d.task is None else "", d.deliveries,
                self.config.max_deliveries, d.ref in done,
                reasons.get(d.task.task_id, "") if d.task is not None else "")
            if verdict is None:
                # A realtime task goes ahead of its site's scheduled and retry tasks.
                self.holder.book(d, urgent=self.consumer.lane_of(d) == "realtime")
            elif verdict.outcome is Outcome.DONE:
                self.completions.ack_committed(d)
                self.stats.inc_value("meteorseed/acked_without_refetch")
            else:
                self.completions.dead_letter(d, verdict.reason)
        # Kept alive from now on, even if the reactor blocks before the next maintain tick.
        self.keepalive.hand(self.holder.held_refs())
        self.holder.changed()

    async def take_over(self, want: int) -> int:
        """Take up to ``want`` tasks of dead workers: at once from a worker whose liveness
        lapsed (:mod:`~meteorseed_scrapy.queue.fleet.liveness`), else once idle for CLAIM_IDLE
        (workers that never registered, failed tasks)."""
        if self._taking.locked():
            return 0  # the other loop is taking over already: not twice the tasks wanted
        async with self._taking:
            return await self._take_over(want)

    async def _take_over(self, want: int) -> int:
        claim_idle = self.config.claim_idle
        count = min(want, 100)
        reclaimed: list[Delivery] = []
        dead = await self.liveness.dead()
        if dead:
            reclaimed, holding = await self.consumer.reclaim_from(dead, count)
            await self.liveness.settle(dead, holding)
            if reclaimed:
                self.stats.inc_value("meteorseed/reclaimed/dead_worker", len(reclaimed))
                logger.info("Took over %d task(s) of dead worker(s) %s", len(reclaimed),
                            ", ".join(text_of(n, "backslashreplace") for n in dead))
        if len(reclaimed) < count:
            idle = await self.consumer.reclaim(claim_idle, count - len(reclaimed))
            if idle:
                logger.info("Reclaimed %d task(s) idle for over %.1fs", len(idle), claim_idle)
            reclaimed += idle
        self.backlog = len(reclaimed) >= count
        if reclaimed:
            self.stats.inc_value("meteorseed/reclaimed", len(reclaimed))
            for d in reclaimed:
                if d.task is not None:
                    logger.debug("Reclaimed task %s (message %s, delivery %d)",
                                 d.task.task_id, d.msg_id, d.deliveries,
                                 extra={"task_id": d.task.task_id, "seed_id": d.task.seed_id})
            await self.accept(reclaimed)
        return len(reclaimed)

    # -- maintain ----------------------------------------------------------------------------
    def _tick(self) -> float:
        # Half a second at most: a dead worker's tasks move on within CLAIM_IDLE + 0.5 s.
        return max(0.05, min(0.5, self.config.claim_idle / 4))

    async def maintain_once(self) -> None:
        tick = self._tick()
        now = time.monotonic()
        held = self.holder.held_refs()
        self.keepalive.hand(held)
        lost = self.keepalive.take_lost()
        if lost:
            # (A ref acked since the thread's snapshot is reported too: not held any more.)
            still = set(held)
            for ref in lost:
                if ref in still:
                    logger.warning("Task message %s of %s was taken over by another worker",
                                   ref[1], ref[0])
                    self.holder.lost(ref)
        worth, buffered = self.holder.wanted()
        want = worth - buffered
        # (Polled often enough that a dead worker's tasks move on soon after CLAIM_IDLE.)
        if want > 0 and now >= self._next_reclaim and not self.backlog \
                and not await self.take_over(want):
            self._next_reclaim = now + tick
        if now >= self._next_promote:
            next_due = await self.delayed.promote()
            self._next_promote = now + (min(next_due, 1.0) if next_due >= 0 else 1.0)
        await asyncio.sleep(tick)

    # -- idle (METEORSEED_IDLE_CLOSE) --------------------------------------------------------
    def written(self) -> None:
        """A task's fate was written here (ack, dead letter): something was left until now."""
        self._written_at = self.clock()
        self.quiet_since = None
        self.recheck.set()

    def quiet_for(self) -> float | None:
        since = self.quiet_since
        return None if since is None else self.clock() - since

    async def idle_once(self) -> None:
        """Look whether anything is left, here or in the namespace; then wait for a write of
        ours, a tick, or the moment the quiet has lasted IDLE_CLOSE (then the engine is woken:
        the scheduler's idle check decides)."""
        self.recheck.clear()
        written_at, self._written_at = self._written_at, None
        quiet = self.holder.locally_quiet() and await self.group.namespace_quiet()
        if not quiet or self._written_at is not None:  # (written meanwhile: look again)
            self.quiet_since = None
        elif self.quiet_since is None:
            # From our last write when it woke this look (nothing was left once it was
            # through; another worker's ack in the milliseconds between counts from it too),
            # else from now: another worker's last task ended since the last look.
            self.quiet_since = written_at if written_at is not None else self.clock()
        wait = self._tick()
        if self.quiet_since is not None:
            left = self.quiet_since + self.config.idle_close - self.clock()
            if left > 0:
                wait = min(wait, left)
            elif self._woken_for != self.quiet_since:
                # Once, when due: each wake of an idle engine fires spider_idle, which Scrapy
                # fires at its heartbeat's pace (a handler's DontCloseSpider), not at our looks.
                self._woken_for = self.quiet_since
                self.holder.changed()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.recheck.wait(), wait)

"""Background I/O of a worker, on the asyncio loop the reactor runs on.

Three loops, so that the engine's synchronous ``next_request()`` never touches the network:

* read: XREADGROUP into a small local buffer, sized by free download capacity;
* maintain: XAUTOCLAIM of dead workers' tasks, keep-alive of our own, the namespace-quiet check;
* flush: children to the stream, acks with completion records, dead letters, failure notes.

Redis going away pauses the loops (with one log line per outage and backoff) and never drops
what is queued: acks, children and dead letters stay queued until Redis takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from meteorseed_scrapy.politeness.breaker import Breaker
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.permits import PermitDesk, SiteQueues
from meteorseed_scrapy.politeness.policy import SiteLimits
from meteorseed_scrapy.queue.consumer import StreamConsumer
from meteorseed_scrapy.queue.dedup import fingerprint
from meteorseed_scrapy.queue.delivery import Delivery, Ref
from meteorseed_scrapy.queue.writer import TaskWriter
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.dispatcher import Dispatcher
from meteorseed_scrapy.worker.ledger import Entry, Outcome, TaskLedger

logger = logging.getLogger(__name__)

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, ConnectionError, OSError)
READ_BLOCK_MS = 500
MAX_COMPLETING = 2  # completion pipelines on the wire at once


class Outage:
    """Shared view of Redis availability: one warning per outage, exponential backoff."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.failures = 0

    def failed(self, exc: BaseException, where: str) -> float:
        self.failures += 1
        delay = min(30.0, 0.25 * 2 ** min(self.failures, 8)) * random.uniform(0.8, 1.2)
        if self.since is None:
            self.since = time.monotonic()
            logger.warning(
                "Redis unavailable during %s (%s): worker paused, nothing is lost; retrying",
                where, exc,
            )
        else:
            logger.debug("Redis still unavailable during %s: %s", where, exc)
        return delay

    def ok(self) -> None:
        if self.since is not None:
            logger.warning(
                "Redis is back after %.1fs: worker resumed", time.monotonic() - self.since
            )
        self.since = None
        self.failures = 0


class StreamPump:
    def __init__(self, consumer: StreamConsumer, writer: TaskWriter, ledger: TaskLedger,
                 config: WorkerConfig, stats: Any, *, gate: SiteGate, breaker: Breaker,
                 limits_for: Callable[[str], SiteLimits] | None, want: Callable[[], int],
                 budget: Callable[[], int], on_change: Callable[[], None]) -> None:
        self.consumer = consumer
        self.writer = writer
        self.ledger = ledger
        self.config = config
        self.stats = stats
        self._want = want
        self._on_change = on_change
        self.gate = gate
        self.buffer = SiteQueues()  # entries read but not started, per site
        self.hops = SiteQueues()  # retries/redirects of tasks we hold, per site
        # (delivery, task to put back, delay s, lane it goes back to)
        self.deferrals: list[tuple[Delivery, ExecTask, float, str]] = []
        self.desk: PermitDesk | None = None
        self.dispatcher: Dispatcher | None = None
        if limits_for is not None:  # None: politeness off, every task may go at once
            self.desk = PermitDesk(gate, stats)
            self.dispatcher = Dispatcher(
                self.desk, self.buffer, self.hops, limits_for, breaker, budget=budget,
                on_change=on_change, park=self.park, stats=stats,
            )
        self.outbox: list[tuple[ExecTask, str | None, bool]] = []
        self.records: list[tuple[ExecTask, str]] = []  # (task, completion record)
        self.acks: list[tuple[Ref, float]] = []  # ((stream, message id), response time or 0)
        self.dead: list[tuple[Delivery, str]] = []
        self.failures: list[tuple[ExecTask, str]] = []
        self.latencies_ms: deque[float] = deque(maxlen=20000)
        self.child_yield: Counter[str] = Counter()  # seed_id -> new child URLs not yet reported
        self.on_settled: Callable[[Entry], None] | None = None  # e.g. the metrics extension
        self.outage = Outage()
        self.read_batch = 4
        # When the maintain loop next refreshes leases, reclaims, promotes due tasks (monotonic).
        self._next_touch = self._next_reclaim = self._next_promote = 0.0
        self.ready = False
        self._checked = False
        self.stopping = False
        self.quiet_since: float | None = None
        self._room = asyncio.Event()
        self._flush_needed = asyncio.Event()
        self._flushing = False
        self._completing: set[asyncio.Future[None]] = set()  # completion pipelines in flight
        self._complete_error: BaseException | None = None  # raised by the next flush
        self._tasks: list[asyncio.Task[None]] = []

    # -- control ---------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks = [
            asyncio.ensure_future(self._guard(self._read_once, "read")),
            asyncio.ensure_future(self._guard(self._maintain_once, "reclaim")),
            asyncio.ensure_future(self._guard(self._flush_once, "ack", self._flush_needed)),
        ]
        if self.dispatcher is not None:
            self._tasks.append(asyncio.ensure_future(self._guard(self.dispatcher.step, "quota")))

    def room(self) -> None:
        """The engine took a task: the read loop may fetch more."""
        self._room.set()

    def kick(self) -> None:
        self._flush_needed.set()

    def want_permits(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.wake.set()

    @property
    def local_quiet(self) -> bool:
        return not (self._has_output() or self.buffer or len(self.ledger) or self._flushing
                    or self._completing)

    async def stop(self, deadline_s: float = 15.0) -> None:
        """Stop reading, flush what is queued (within a deadline), hand back the rest."""
        self.stopping = True
        self._room.set()
        self._flush_needed.set()
        await asyncio.wait(self._tasks[:2], timeout=READ_BLOCK_MS / 1000 + 2)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.desk is not None:
            self.desk.give_back_all()
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                await self._flush_once()
                await self._settle_completing()
                if self.desk is not None:
                    await self.desk.flush()
                unsettled = [d for e in self.ledger.entries() for d in e.deliveries]
                n = await self.consumer.hand_back(unsettled, idle_s=self.config.claim_idle + 3600)
                if n:
                    logger.info("Handed %d unfinished task(s) back to the stream", n)
                    self.stats.inc_value("meteorseed/handed_back", n)
                if not self._has_output():
                    return
            except REDIS_DOWN as exc:
                await asyncio.sleep(min(self.outage.failed(exc, "shutdown"), 1.0))
        logger.error(
            "Stopped with %d ack(s), %d child request(s) and %d dead letter(s) not written: "
            "those tasks stay pending and will be redelivered",
            len(self.acks), len(self.outbox), len(self.dead),
        )

    async def _guard(self, step: Callable[[], Any], where: str,
                     event: asyncio.Event | None = None) -> None:
        while not self.stopping:
            try:
                if not self.ready:
                    await self._setup()
                await step()
                self.outage.ok()
            except REDIS_DOWN as exc:
                self.stats.inc_value("meteorseed/redis/errors")
                await asyncio.sleep(self.outage.failed(exc, where))
                continue
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    logger.exception("Redis refused a command in the %s loop; continuing", where)
                    await asyncio.sleep(1.0)
                    continue
                # The stream or group vanished (a Redis restart without persistence, a reset):
                # create it again rather than spin on the error.
                logger.warning("Consumer group %r is gone (%s): creating it again",
                               self.consumer.keys.group, exc)
                self.ready = False
                await asyncio.sleep(0.5)
                continue
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Unexpected error in the %s loop; continuing", where)
                await asyncio.sleep(1.0)
                continue
            if event is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), 0.05 if self._has_output() else 1.0)
                event.clear()

    async def _setup(self) -> None:
        await self.consumer.ensure_group()
        if not self._checked:
            self._checked = True  # once, although several loops may be setting up at once
            for warning in await self.consumer.check_durability():
                logger.warning("%s", warning)
        self.ready = True

    # -- read --------------------------------------------------------------------------------
    async def _read_once(self) -> None:
        want = self._want() - len(self.buffer)
        # While tasks are still buffered, read in batches rather than one per finished task:
        # each read costs the busy reactor a round trip.
        if want <= 0 or (self.buffer and want < self.read_batch):
            self._room.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._room.wait(), 0.5 if want <= 0 else 0.05)
            return
        deliveries = await self.consumer.read(want, READ_BLOCK_MS)
        if self.stopping:
            await self.consumer.hand_back(deliveries, idle_s=self.config.claim_idle + 3600)
            return
        if deliveries:
            self.stats.inc_value("meteorseed/read", len(deliveries))
            for lane, n in Counter(self.consumer.lane_of(d) for d in deliveries).items():
                self.stats.inc_value(f"meteorseed/read/{lane}", n)
            await self._accept(deliveries)

    async def _accept(self, deliveries: Sequence[Delivery]) -> None:
        redelivered = [d for d in deliveries if d.task is not None and d.deliveries > 1]
        records = await self.consumer.completion_records(
            [d.task for d in redelivered if d.task is not None]
        )
        done = {d.ref for d, r in zip(redelivered, records, strict=True) if r}
        reasons = await self.consumer.failure_notes(
            [d.task for d in redelivered if d.task is not None
             and d.deliveries > self.config.max_deliveries]
        )
        for d in deliveries:
            if d.task is None:
                self.dead.append((d, d.error))
            elif d.ref in done:
                # Committed before its worker died, not yet acked: ack without a refetch.
                self.acks.append((d.ref, 0.0))
                self.stats.inc_value("meteorseed/acked_without_refetch")
            elif d.deliveries > self.config.max_deliveries:
                last = reasons.get(d.task.task_id) or "no failure recorded (worker died?)"
                self.dead.append((d, f"delivered {d.deliveries} times, more than "
                                     f"METEORSEED_MAX_DELIVERIES={self.config.max_deliveries}; "
                                     f"last failure: {last}"))
            else:
                entry = self.ledger.add(d)
                if entry is not None:
                    # A realtime task goes ahead of its site's scheduled and retry tasks
                    # already buffered (kept, too, when the site's excess is parked).
                    self.buffer.append(entry.task.site_id, entry,
                                       urgent=self.consumer.lane_of(d) == "realtime")
                    self.want_permits()
        if self.dead or done:
            self.kick()
        self._on_change()

    # -- maintain ----------------------------------------------------------------------------
    async def _maintain_once(self) -> None:
        claim_idle = self.config.claim_idle
        tick = max(0.05, min(1.0, claim_idle / 4))
        now = time.monotonic()
        if now >= self._next_touch:
            self._next_touch = now + claim_idle / 3
            lost = await self.consumer.touch(self.ledger.refs())
            for ref in lost:
                logger.warning("Task message %s of %s was taken over by another worker",
                               ref[1], ref[0])
                self.ledger.forget_msg(ref)
        want = self._want() - len(self.buffer)
        if want > 0 and now >= self._next_reclaim:
            reclaimed = await self.consumer.reclaim(claim_idle, min(want, 100))
            if reclaimed:
                self.stats.inc_value("meteorseed/reclaimed", len(reclaimed))
                logger.info("Reclaimed %d task(s) idle for over %.1fs", len(reclaimed), claim_idle)
                for d in reclaimed:
                    if d.task is not None:
                        logger.debug("Reclaimed task %s (message %s, delivery %d)",
                                     d.task.task_id, d.msg_id, d.deliveries,
                                     extra={"task_id": d.task.task_id, "seed_id": d.task.seed_id})
                await self._accept(reclaimed)
            else:
                # Poll often enough that a dead worker's tasks move on soon after CLAIM_IDLE.
                self._next_reclaim = now + max(0.1, min(1.0, claim_idle / 4))
        if now >= self._next_promote:
            next_due = await self.gate.promote()
            self._next_promote = now + (min(next_due, 1.0) if next_due >= 0 else 1.0)
        if self.config.idle_close:
            quiet = self.local_quiet and await self.consumer.namespace_quiet()
            if not quiet:
                self.quiet_since = None
            elif self.quiet_since is None:
                self.quiet_since = time.monotonic()
            self._on_change()
        await asyncio.sleep(tick)

    # -- flush -------------------------------------------------------------------------------
    def _has_output(self) -> bool:
        return bool(self.outbox or self.records or self.acks or self.dead or self.failures
                    or self.deferrals)

    async def _flush_once(self) -> None:
        self._raise_complete_error()  # a pipeline sent earlier failed: back off first
        self._flushing = True
        try:
            await self._flush_children()
            if self.records or self.acks:
                # The records of these tasks were queued with (or before) their acks.
                records = self.records[:500]
                batch = self.acks[:500] if len(records) == len(self.records) else []
                del self.records[: len(records)]
                del self.acks[: len(batch)]
                # Sent without waiting for the pipeline already on the wire: on a busy reactor
                # a round trip is long, and an ack queued meanwhile would wait for it first.
                done = asyncio.ensure_future(self._complete(records, batch))
                self._completing.add(done)
                done.add_done_callback(self._completing.discard)
                if len(self._completing) >= MAX_COMPLETING:
                    await asyncio.wait(self._completing, return_when=asyncio.FIRST_COMPLETED)
            while self.dead:
                delivery, reason = self.dead[0]
                fp = fingerprint(delivery.task) if delivery.task is not None else ""
                await self.consumer.dead_letter(delivery, reason, fp)
                self.dead.pop(0)
                self.stats.inc_value("meteorseed/dead")
                task = delivery.task
                logger.error("Dead-lettered task message %s (%s): %s", delivery.msg_id,
                             task.url if task else "undecodable", reason,
                             extra={"task_id": task and task.task_id,
                                    "seed_id": task and task.seed_id})
            while self.deferrals:
                delivery, task, delay, lane = self.deferrals[0]
                await self.gate.defer(delivery.ref, task, delay, lane)
                self.deferrals.pop(0)
                self.stats.inc_value("meteorseed/deferred")
            if self.failures:
                batch_f = self.failures[:500]
                await self.consumer.note_failures(batch_f, self.config.done_ttl)
                del self.failures[: len(batch_f)]
        finally:
            self._flushing = False
        if self._has_output():
            self._flush_needed.set()

    async def _complete(self, records: list[tuple[ExecTask, str]],
                        batch: list[tuple[Ref, float]]) -> None:
        """One completion pipeline (records, XACK, XDEL); on failure its records and acks go
        back to the front of the queues (nothing is lost) and the next flush backs off."""
        try:
            await self.consumer.complete(records, [m for m, _ in batch], self.config.done_ttl)
        except BaseException as exc:
            self.records[:0] = records
            self.acks[:0] = batch
            if not isinstance(exc, Exception):  # cancelled (stopping)
                raise
            # Not re-raised: nobody awaits this task's result (the error would go unretrieved);
            # the next flush raises it where the loop's outage handling is.
            self._complete_error = exc
            self._flush_needed.set()
            return
        now = time.monotonic()
        self.latencies_ms.extend((now - t) * 1000 for _, t in batch if t)
        if batch:
            self.stats.inc_value("meteorseed/acked", len(batch))

    async def _settle_completing(self) -> None:
        """Wait for the completion pipelines in flight; raise the first failure."""
        if self._completing:
            await asyncio.gather(*self._completing, return_exceptions=True)
        self._raise_complete_error()

    def _raise_complete_error(self) -> None:
        if self._complete_error is not None:
            error, self._complete_error = self._complete_error, None
            raise error

    async def _flush_children(self) -> None:
        while self.outbox:
            batch = self.outbox[:500]
            for dedup in (True, False):
                tasks = [t for t, _, d in batch if d is dedup]
                if tasks:
                    result = await self.writer.add(tasks, dedup=dedup)
                    self.stats.inc_value("meteorseed/children/enqueued", result.enqueued)
                    self.stats.inc_value("meteorseed/children/duplicates", result.duplicates)
                    if dedup:  # new URLs found: the yield of their seed (adaptive schedules)
                        for task, fresh in zip(tasks, result.fresh, strict=True):
                            if fresh:
                                self.child_yield[task.seed_id] += 1
            del self.outbox[: len(batch)]
            for _, parent, _ in batch:
                if parent is not None:
                    settled = self.ledger.child_durable(parent)
                    if settled is not None:
                        self.settle(settled)

    # -- outcomes ----------------------------------------------------------------------------
    def park(self, entry: Entry, delay_s: float) -> None:
        """Put a task that has not started back for later (its site may not be fetched now)."""
        self.ledger.pop(entry.task.task_id)
        first, *dups = entry.deliveries
        self.deferrals.append((first, entry.task, delay_s, entry.task.lane))
        self.acks.extend((d.ref, 0.0) for d in dups)
        self.kick()

    def settle(self, entry: Entry) -> None:
        """Queue what a settled task needs: an ack, a dead letter, a deferral or a failure note."""
        self.ledger.pop(entry.task.task_id)
        self._room.set()  # capacity came free: the reader may fetch the next tasks now
        outcome = entry.outcome
        self.stats.inc_value(f"meteorseed/outcome/{outcome.value if outcome else 'none'}")
        if outcome is Outcome.FAILED:
            # Left pending: no keep-alive from now on, so it is reclaimed after CLAIM_IDLE.
            self.failures.append((entry.task, entry.reason))
            logger.warning("Task %s (%s) failed and will be redelivered: %s",
                           entry.task.task_id, entry.task.url, entry.reason,
                           extra={"task_id": entry.task.task_id, "seed_id": entry.task.seed_id})
        elif outcome is Outcome.DEFERRED:
            first, *dups = entry.deliveries
            task = entry.defer_task or entry.task
            self.deferrals.append((first, task, entry.defer_s, entry.defer_lane or task.lane))
            self.acks.extend((d.ref, 0.0) for d in dups)
        elif outcome is Outcome.DEAD:
            first, *dups = entry.deliveries
            self.dead.append((first, entry.reason))
            self.acks.extend((d.ref, 0.0) for d in dups)
        else:
            self.records.append((entry.task, entry.record()))
            self.acks.extend((d.ref, entry.response_at) for d in entry.deliveries)
        if self.on_settled is not None:
            self.on_settled(entry)
        self.kick()

"""What settled tasks leave to write to Redis, and the flush that writes it.

Child requests go to the stream first (a parent is acked only once its children are durable);
then acks with their completion records, dead letters, deferrals and failure notes. What Redis
does not take stays queued for the next flush: nothing is lost while Redis is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.consume.acks import Completion, TaskRecords
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.delivery import Delivery, Ref
from meteorseed_scrapy.queue.consume.task_history import HistoryQueue, TaskHistory
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.crawl_progress import Settle
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.task.context import Scrape
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.children import ChildOutbox
from meteorseed_scrapy.worker.fate import Outcome, Verdict
from meteorseed_scrapy.worker.ledger import Entry

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

MAX_COMPLETING = 4  # completion pipelines on the wire at once
BATCH = 500


class Completions:
    """Queues of writes, and the flush step of the worker's flush loop."""

    def __init__(self, consumer: StreamConsumer, writer: TaskWriter, delayed: DelayedSet,
                 config: WorkerConfig, stats: StatsCollector, *,
                 on_child_durable: Callable[[str], None],
                 on_new_urls: Callable[[Iterable[str]], None],
                 on_children: Callable[[list[ExecTask], tuple[bool, ...]], None] | None = None,
                 history: TaskHistory | None = None) -> None:
        self.consumer = consumer
        self.task_records = TaskRecords(consumer.redis, consumer.keys)
        self.writer = writer
        self.delayed = delayed
        self.config = config
        self.stats = stats
        self.needed = asyncio.Event()  # something was queued: the flush loop may go now
        self.outbox = ChildOutbox(writer, stats, on_written=on_child_durable,
                                  on_new_urls=on_new_urls, on_batch=on_children)
        # ((stream, message id), response time or 0, what it counts for in its seed's progress,
        # a finished task's completion record and items feed entries: written with its ack)
        self.acks: list[tuple[Ref, float, Settle, Completion | None]] = []
        self.dead: list[tuple[Delivery, str]] = []
        self.failures: list[tuple[ExecTask, str]] = []
        # (delivery, task to put back, delay s, lane it goes back to, why: recorded with it)
        self.deferrals: list[tuple[Delivery, ExecTask, float, str, DeferReason]] = []
        self.latencies_ms: deque[float] = deque(maxlen=20000)
        # Settled tasks' ends for their sites' task history, written after the acks.
        self.history = HistoryQueue(history, writer.fingerprint, consumer.consumer)
        self.closing = False  # the worker stops: write everything now
        self._flushing = False
        self._completing: set[asyncio.Future[None]] = set()  # completion pipelines in flight
        self._starting = False  # one is about to start: it takes what is queued by then
        self._complete_error: BaseException | None = None  # raised by the next flush
        #: Told each time a task's fate is written (an ack, a dead letter): the idle check.
        self.on_fate_written: Callable[[], None] = lambda: None

    # -- queueing ------------------------------------------------------------------------------
    def child(self, task: ExecTask, parent: Scrape | None, dedup: bool) -> None:
        """Queue a request ``parent``'s callback yielded (None: ``start()``); raises
        :class:`~meteorseed_scrapy.task.validation.TaskError` when it cannot be written."""
        self.outbox.add(task, parent, dedup)
        self.needed.set()

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        self.dead.append((delivery, reason))
        self.needed.set()

    def ack_committed(self, delivery: Delivery) -> None:
        """A redelivered task whose completion record exists: ack it without a refetch."""
        self.acks.append((delivery.ref, 0.0, Settle.of(delivery.task), None))
        self.needed.set()

    def parked(self, entry: Entry, delay_s: float, why: DeferReason = DeferReason.OTHER
               ) -> None:
        """A task that has not started goes back for later (its site may not be fetched now)."""
        if self._held(entry, "parked"):
            self.deferrals.append((self._first(entry), entry.task, delay_s, entry.task.lane, why))
            self.needed.set()

    def settled(self, entry: Entry, verdict: Verdict) -> None:
        """Queue what ``verdict`` on a settled task needs: an ack, a dead letter, a deferral or a
        failure note."""
        outcome = verdict.outcome
        if not self._held(entry, outcome.value):
            return
        self.stats.inc_value(f"meteorseed/outcome/{outcome.value}")
        task = entry.task
        if outcome is Outcome.FAILED:
            # Left pending: no keep-alive from now on, so it is reclaimed after CLAIM_IDLE.
            self.failures.append((task, verdict.reason))
            logger.warning("Task %s (%s) failed and will be redelivered: %s",
                           task.task_id, task.url, verdict.reason,
                           extra={"task_id": task.task_id, "seed_id": task.seed_id})
        elif outcome is Outcome.DEFERRED:
            again = verdict.defer_task or task
            self.deferrals.append((self._first(entry), again, verdict.defer_s,
                                   verdict.defer_lane or again.lane, verdict.defer_why))
        elif outcome is Outcome.DEAD:
            self.dead.append((self._first(entry), verdict.reason))
        else:
            scrape = entry.scrape
            self.history.add(task, outcome.value, items=scrape.committed if scrape else 0,
                             status=verdict.status, reason=verdict.reason)
            done = Completion(task, entry.record(), tuple(scrape.feed) if scrape else ())
            self.acks.append((self._first(entry).ref, entry.response_at, entry.settle(), done))
            if self._send_now():
                return  # (nothing left for the flush loop: no need to wake it)
        self.needed.set()

    def _held(self, entry: Entry, outcome: str) -> bool:
        """Whether a delivery of ``entry`` is still this worker's. When none is, its message
        left this worker while the task ran (taken over by another worker, or lost with its
        stream): this worker has nothing to write for it."""
        if entry.deliveries:
            return True
        task = entry.task
        self.stats.inc_value("meteorseed/settled_unheld")
        logger.info("Task %s (%s) ended here (%s) after its message left this worker (taken "
                    "over, or lost with its stream): nothing written for it", task.task_id,
                    task.url, outcome, extra={"task_id": task.task_id, "seed_id": task.seed_id})
        return False

    def _first(self, entry: Entry) -> Delivery:
        """``entry``'s first delivery, the one its fate is written for; the others (the same
        task delivered again while it was held) are only acked."""
        first, *again = entry.deliveries
        self.acks.extend((d.ref, 0.0, Settle.of(entry.task), None) for d in again)
        return first

    # -- state ---------------------------------------------------------------------------------
    def pending(self) -> bool:
        """Anything queued and not yet written (task history records once a batch is due)."""
        return self._writes() or self.history.due(self.closing)

    def _writes(self) -> bool:
        return bool(self.outbox or self.acks or self.dead or self.failures or self.deferrals)

    def refs_in_hand(self) -> list[Ref]:
        """Messages of settled tasks queued for an ack, a dead letter or a deferral: still
        pending on this worker, so kept alive until written."""
        return ([ack[0] for ack in self.acks] + [d.ref for d, _ in self.dead]
                + [d[0].ref for d in self.deferrals])

    def busy(self) -> bool:
        """Anything queued, being written, or on the wire."""
        return self.unsettled() or self._flushing or bool(self.history)

    def unsettled(self) -> bool:
        """A task's write still queued or on the wire (each stays queued until written, an
        ack until its pipeline is through); not a history record: those wait to be batched,
        and the worker writes them when it stops."""
        return self._writes() or bool(self._completing)

    # -- flush ---------------------------------------------------------------------------------
    async def flush_once(self) -> None:
        self._raise_complete_error()  # a pipeline sent earlier failed: back off first
        self._flushing = True
        try:
            await self.outbox.flush()
            if self.acks:
                # Sent without waiting for the pipeline already on the wire: on a busy reactor
                # a round trip is long, and an ack queued meanwhile would wait for it first.
                self._in_flight(self._complete(self._take()))
                if len(self._completing) >= MAX_COMPLETING:
                    await asyncio.wait(self._completing, return_when=asyncio.FIRST_COMPLETED)
            while self.dead:
                delivery, reason = self.dead[0]
                task, fp = delivery.task, b""  # the writer's key (the project's fingerprinter's)
                if task is not None:
                    with contextlib.suppress(ValueError):  # no key: nothing to release
                        fp = self.writer.fingerprint(task)
                dead_id = await self.consumer.dead_letter(delivery, reason, fp.hex())
                self.dead.pop(0)
                self.on_fate_written()
                url = task.url if task else "undecodable"
                extra = {"task_id": task and task.task_id, "seed_id": task and task.seed_id}
                if not dead_id:
                    # Reclaimed by another worker meanwhile (normal in a fleet): its to settle.
                    self.stats.inc_value("meteorseed/dead/refused")
                    logger.info("Task %s (message %s, %s) was taken over by another worker: "
                                "not dead-lettered here (%s)", task.task_id if task else "-",
                                delivery.msg_id, url, reason, extra=extra)
                    continue
                self.stats.inc_value("meteorseed/dead")
                if task is not None and fp:  # (no key: no record, as the history skips it)
                    self.history.add(task, "dead", reason=reason, fingerprint=fp)
                logger.error("Dead-lettered task %s (%s) as dead letter %s (meteorseed dead show "
                             "%s): %s", task.task_id if task else f"message {delivery.msg_id}",
                             url, dead_id, dead_id, reason, extra=extra)
            while self.deferrals:
                delivery, task, delay, lane, why = self.deferrals[0]
                deferred = await self.delayed.defer(delivery.ref, task, delay, lane, why,
                                                 owner=self.consumer.consumer)
                self.deferrals.pop(0)
                # Not deferred: another worker reclaimed it meanwhile, and it is that one's now.
                self.stats.inc_value("meteorseed/deferred" if deferred
                                     else "meteorseed/deferred/refused")
            if self.failures:
                batch_f = self.failures[:BATCH]
                await self.task_records.note_failures(batch_f, self.config.done_ttl)
                del self.failures[: len(batch_f)]
            if self.history.due(self.closing):
                await self.history.write_batch()
        finally:
            self._flushing = False
        if self.pending():
            self.needed.set()

    def _take(self) -> list[tuple[Ref, float, Settle, Completion | None]]:
        batch = self.acks[:BATCH]
        del self.acks[: len(batch)]
        return batch

    def _in_flight(self, pipeline: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        done = asyncio.ensure_future(pipeline)
        self._completing.add(done)
        done.add_done_callback(self._completing.discard)
        return done

    def _send_now(self) -> bool:
        """Start a completion pipeline from the settling task itself: waking the flush loop
        costs a few turns of a busy reactor (milliseconds each) before it is sent. It takes
        what is queued when it starts (the next turn), so tasks settling in the same turn go
        together. Left to the flush loop while it runs, after a failure (it backs off), or
        with MAX_COMPLETING pipelines on the wire (acks then gather into one)."""
        if self._flushing or self._complete_error is not None or self.outbox:
            return False
        if self._starting:
            return True
        if len(self._completing) >= MAX_COMPLETING:
            return False
        self._starting = True
        # (reset when it starts; also when cancelled before it could: nothing may wait on it)
        self._in_flight(self._complete_queued()).add_done_callback(self._started)
        return True

    def _started(self, _: object = None) -> None:
        self._starting = False

    async def _complete_queued(self) -> None:
        self._started()
        batch = self._take()
        if self.pending():  # (more than one pipeline's worth, or a flush's work)
            self.needed.set()
        if batch:
            await self._complete(batch)

    async def drain(self) -> None:
        """Wait for the completion pipelines in flight; raise the first failure."""
        if self._completing:
            await asyncio.gather(*self._completing, return_exceptions=True)
        self._raise_complete_error()

    async def _complete(self, batch: list[tuple[Ref, float, Settle, Completion | None]]
                        ) -> None:
        """One completion pipeline (per stream, ack.lua: items feed, records, XACK, XDEL); on
        failure its acks go back to the front of the queue with their records and feed entries
        (nothing is lost) and the next flush backs off."""
        try:
            await self.consumer.complete([a[0] for a in batch], self.config.done_ttl,
                                         [a[2] for a in batch], [a[3] for a in batch],
                                         self.config.items_feed)
        except BaseException as exc:
            self.acks[:0] = batch
            if not isinstance(exc, Exception):  # cancelled (stopping)
                raise
            # Not re-raised: nobody awaits this task's result (the error would go unretrieved);
            # the next flush raises it where the loop's outage handling is.
            self._complete_error = exc
            self.needed.set()
            return
        now = time.monotonic()
        self.latencies_ms.extend((now - a[1]) * 1000 for a in batch if a[1])
        self.stats.inc_value("meteorseed/acked", len(batch))
        self.on_fate_written()
        fed = sum(len(a[3].feed) for a in batch if a[3] is not None)
        if fed:
            self.stats.inc_value("meteorseed/items_feed/entries", fed)

    def _raise_complete_error(self) -> None:
        if self._complete_error is not None:
            error, self._complete_error = self._complete_error, None
            raise error

    # -- at shutdown ---------------------------------------------------------------------------
    def record_ack_latency(self) -> None:
        """p50 and p95 of response -> ack, in ms, into the stats."""
        samples = list(self.latencies_ms)
        if samples:  # (the 10th of 19 cut points is the median)
            cuts = statistics.quantiles(samples, n=20) if len(samples) > 1 else samples * 19
            for name, cut in (("p50", cuts[9]), ("p95", cuts[18])):
                self.stats.set_value(f"meteorseed/ack_latency_ms/{name}", round(cut, 1))

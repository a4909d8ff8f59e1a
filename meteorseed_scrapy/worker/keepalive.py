"""Keep-alive of a live worker and its tasks, from a daemon thread with its own Redis client.

A task pending on a consumer is reclaimed by another worker once it has been idle for
``METEORSEED_CLAIM_IDLE``, or at once when its worker is listed dead in the live-worker registry
(:mod:`meteorseed_scrapy.queue.fleet.liveness`). Both keep-alives must therefore go on while the
reactor cannot run: a callback that blocks it for 30 s must not lose its task, however short
CLAIM_IDLE is. So they are not made on the event loop: this thread renews the worker's liveness
every :func:`beat_interval` and touches its tasks every :func:`touch_interval`; the loop hands
it a snapshot of the refs it holds (at every maintain tick and whenever tasks are booked) and
takes back those reported as no longer ours. A snapshot not renewed for :data:`STALE_S` means a
reactor stuck for good: the thread stops both, and the tasks go to other workers, as if this
one had died.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delivery import Ref
from meteorseed_scrapy.queue.fleet.liveness import Heartbeat, beat_interval, liveness_ttl
from meteorseed_scrapy.queue.plumbing.connection import REDIS_FAILURES, sync_client
from meteorseed_scrapy.queue.plumbing.scripts import ScriptPipeline, register
from meteorseed_scrapy.queue.shards import is_cluster

if TYPE_CHECKING:
    from redis.commands.core import Script

    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis

logger = logging.getLogger(__name__)

#: A reactor that has not handed a snapshot for this long is stuck: stop keeping its tasks.
STALE_S = 300.0


def touch_interval(claim_idle: float) -> float:
    """Five touches per CLAIM_IDLE: a touch may be late by most of CLAIM_IDLE (a slow Redis, a
    thread starved of the GIL) before a live worker's task could be reclaimed."""
    return max(0.02, claim_idle / 5)


class KeepAlive:
    """Renews the worker's liveness every :func:`beat_interval` of CLAIM_IDLE and touches the
    refs of the latest snapshot every :func:`touch_interval`."""

    def __init__(self, consumer: StreamConsumer, redis_url: str, claim_idle: float) -> None:
        self._consumer = consumer
        self._url = redis_url
        self.interval = touch_interval(claim_idle)
        self.beat_s = beat_interval(claim_idle)
        self.ttl_s = liveness_ttl(claim_idle)
        # At a stop, alive for CLAIM_IDLE more, as its last touches keep its tasks: the stop
        # flushes its acks and hands the rest back before it leaves the registry.
        self.stop_ttl_s = claim_idle
        # Replaced whole (never mutated) by the loop: the thread reads one consistent tuple.
        self._refs: tuple[Ref, ...] = ()
        self._handed_at = time.monotonic()
        self._lost: list[Ref] = []
        self._lost_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.touches = self.failures = 0  # rounds made, rounds Redis did not answer
        self.beats = 0  # liveness renewals that landed

    def hand(self, refs: Sequence[Ref]) -> None:
        """The refs to keep alive from now on (called on the event loop)."""
        self._refs = tuple(refs)
        self._handed_at = time.monotonic()

    def take_lost(self) -> list[Ref]:
        """Refs reported as no longer pending on this consumer since the last call."""
        with self._lost_lock:
            lost, self._lost = self._lost, []
        return lost

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="meteorseed-keepalive",
                                            daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop touching (before tasks are handed back: a touch would undo their idle time)."""
        self._stop.set()
        self._refs = ()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        client = sync_client(self._url, decode_responses=True, socket_timeout=10,
                             socket_connect_timeout=5)
        script = register(client, "touch")
        heart = Heartbeat(client, self._consumer.keys, self._consumer.consumer)
        cluster = is_cluster(client)
        failing = False
        next_touch = 0.0
        try:
            while True:  # (the first beat at once: listed before any task is read)
                if time.monotonic() - self._handed_at > STALE_S:
                    if self._stop.wait(self.beat_s):
                        return  # stuck, then stopped: no last beat either
                    continue
                refs = self._refs
                try:
                    if heart.beat(self.ttl_s):
                        self.beats += 1
                    if refs and time.monotonic() >= next_touch:
                        next_touch = time.monotonic() + self.interval
                        lost = self._touch(client, script, cluster, refs)
                        self.touches += 1
                        if lost:
                            with self._lost_lock:
                                self._lost.extend(lost)
                    failing = False
                except REDIS_FAILURES as exc:
                    # The loops log the outage; the next round tries again.
                    if not failing:
                        logger.debug("Keep-alive of %d task(s) failed: %s", len(refs), exc)
                    failing = True
                    self.failures += 1
                if self._stop.wait(self.beat_s):
                    break
            with contextlib.suppress(*REDIS_FAILURES):
                heart.beat(self.stop_ttl_s)
        finally:
            client.close()

    def _touch(self, client: SyncRedis, script: Script, cluster: bool, refs: Sequence[Ref]
               ) -> list[Ref]:
        calls = self._consumer.touch_calls(refs)
        if cluster:  # (a cluster pipeline refuses EVALSHA; each call stays in one slot)
            replies = [script(keys=keys, args=args) for keys, args in calls]
        else:
            with client.pipeline(transaction=False) as pipe:
                batch = ScriptPipeline(pipe)
                for keys, args in calls:
                    batch.call(script, keys, args)
                replies = batch.execute_sync()
        return self._consumer.touch_lost(calls, replies)

"""Which workers of a namespace are alive: the live-worker registry (``<ns>:workers``).

A worker's keep-alive thread (:mod:`meteorseed_scrapy.worker.keepalive`) lists its consumer with
a liveness deadline (Redis time) and renews it every :func:`beat_interval` for
:func:`liveness_ttl`; it runs whatever the reactor does (a callback blocking it for 30 s, a 60 s
download), and stops only with the process or a reactor stuck for good. A consumer listed whose
deadline has passed is dead: the others take its pending tasks at once
(:meth:`StreamConsumer.reclaim_from`) instead of waiting until they are idle for CLAIM_IDLE,
then drop it from the registry. A consumer never listed (an older version, another tool) is
not judged here: its tasks still go after CLAIM_IDLE.

Both intervals derive from ``METEORSEED_CLAIM_IDLE``, the operator's word for how late a live
worker's Redis round trip may be: the deadline is renewed every CLAIM_IDLE/10 and lasts
CLAIM_IDLE/2, so a worker is declared dead only after four renewals in a row failed to land
(0.4 CLAIM_IDLE of a stalled thread or an unreachable Redis, where the touches of its tasks
would be four rounds late too). The price of a wrong verdict is what CLAIM_IDLE already pays:
the task runs twice (its first worker's ack is refused, a committed one is not refetched).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.queue.plumbing.scripts import Scripts, call_as_bytes, register
from meteorseed_scrapy.settings import DEFAULTS

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis, SyncRedis

__all__ = ["Heartbeat", "Liveness", "beat_interval", "check_interval", "liveness_ttl"]

logger = logging.getLogger(__name__)

#: Dead workers judged per check (a registry full of them is worked through, this many a time).
MAX_DEAD = 16


def beat_interval(claim_idle: float) -> float:
    """How often a worker renews its liveness: ten times per CLAIM_IDLE."""
    return max(0.01, claim_idle / 10)


def liveness_ttl(claim_idle: float) -> float:
    """How long a renewal keeps a worker alive: half of CLAIM_IDLE, five renewals."""
    return claim_idle / 2


def check_interval(claim_idle: float) -> float:
    """How often a worker looks for dead ones: once per renewal, at most once a second (one
    round trip; a dead worker's tasks move on within its TTL plus this)."""
    return min(1.0, beat_interval(claim_idle))


class Heartbeat:
    """The keep-alive thread's side: renews this worker's liveness on a blocking client."""

    def __init__(self, client: SyncRedis, keys: KeyLayout, consumer: str) -> None:
        self._script = register(client, "beat")
        self._key = keys.workers
        self._consumer = consumer

    def beat(self, ttl_s: float) -> bool:
        """Alive for ``ttl_s`` from now; False when the registry key is not a registry (then
        this worker is simply not listed: its tasks are taken over after CLAIM_IDLE)."""
        return bool(self._script(keys=[self._key],
                                 args=[self._consumer, max(1, int(ttl_s * 1000))]))


class Liveness:
    """The registry as one worker (``consumer``) sees it, on an asyncio client: who is dead,
    forgetting them, leaving it."""

    def __init__(self, redis: AsyncRedis, keys: KeyLayout, consumer: str,
                 claim_idle: float = DEFAULTS["METEORSEED_CLAIM_IDLE"]) -> None:
        self.redis = redis
        self.keys = keys
        self.consumer = consumer
        self.check_s = check_interval(claim_idle)
        self._scripts = Scripts(redis)
        self._next_check = 0.0  # monotonic
        self._dead: list[bytes] = []  # known dead and still holding entries
        self._warned = False

    async def dead(self) -> list[bytes]:
        """Consumers known to be dead (names as stored): from the registry at most every
        :func:`check_interval`, else those of the last check that still held entries."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.check_s
            self._dead = await self._lapsed()
        return list(self._dead)

    async def _lapsed(self) -> list[bytes]:
        names = await call_as_bytes(self.redis, self._scripts["lapsed"], [self.keys.workers],
                                    [self.consumer, MAX_DEAD])
        if names is None:
            if not self._warned:
                self._warned = True
                logger.warning("%s is not a live-worker registry (zset): dead workers' tasks "
                               "are taken over after METEORSEED_CLAIM_IDLE only",
                               self.keys.workers)
            return []
        return list(names)

    async def settle(self, dead: Sequence[bytes], holding: set[bytes]) -> None:
        """After a take-over from ``dead``: those that still hold entries are taken from again
        at the next call (no registry check needed); the others leave the registry."""
        self._dead = [n for n in dead if n in holding]
        gone = [n for n in dead if n not in holding]
        if gone:
            await self._scripts["forget"](keys=[self.keys.workers], args=gone)
            logger.info("Dead worker(s) %s hold nothing any more: dropped from the registry",
                        ", ".join(text_of(n, "backslashreplace") for n in gone))

    async def leave(self, holding: bool) -> None:
        """A clean stop, after its tasks were handed back: off the registry; or, when entries
        are still pending on it (handed back, or acks that could not be written), marked dead
        now, so that the others take them at once (and drop it then). Not listed: nothing."""
        if holding:
            await self.redis.zadd(self.keys.workers, {self.consumer: 0}, xx=True)
        else:
            await self.redis.zrem(self.keys.workers, self.consumer)

"""The completion webhook's deliverer: a seed's ``finished`` event becomes one signed POST to
its ``notify`` URL, at least once (docs/webhooks.md).

It reads ``<ns>:events`` as consumer group :data:`GROUP` (any number of deliverers share it:
each event goes to one of them). An event is acknowledged only once its call got a 2xx or was
given up; one left pending by a deliverer that stopped mid-call (killed, cancelled) is taken
over by another after ``METEORSEED_NOTIFY_CLAIM_IDLE`` (XAUTOCLAIM) and called again. While a
call waits between attempts its deliverer keeps the entry fresh, so no other takes it.

An attempt is retried on a network error, a timeout, a 5xx, 408, 425 or 429, after
``min(BACKOFF_MAX, max(Retry-After, BACKOFF_BASE * 2^n))`` plus jitter; after
``METEORSEED_NOTIFY_ATTEMPTS`` attempts, or on an answer no retry changes (another 4xx, a
redirect, a refused address), the event ``notify failed`` (seed, url, reason, attempts) is
appended to the stream and logged. A 2xx appends ``notify delivered``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from meteorseed_scrapy.observability import webhook
from meteorseed_scrapy.politeness.policy import Backoff
from meteorseed_scrapy.queue.fleet import events
from meteorseed_scrapy.queue.fleet.events import CrawlEvent, Event, EventReader
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import REDIS_FAILURES
from meteorseed_scrapy.settings import (
    DEFAULTS,
    duration_setting,
    flag_setting,
    integer_setting,
    setting,
)
from meteorseed_scrapy.validators import ConfigError

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis
    from meteorseed_scrapy.settings import SettingsSource

logger = logging.getLogger(__name__)
T = TypeVar("T")

GROUP = "notify"
SECRET_SETTING = "METEORSEED_NOTIFY_SECRET"
#: Milliseconds one read waits for new events (then stopping and take-overs are looked at).
READ_BLOCK_MS = 1000

#: ``notify_url(seed_id)``: the seed's webhook URL, or None (no webhook, or no such seed).
NotifyLookup = Callable[[str], Awaitable[str | None]]
Post = Callable[..., Awaitable[webhook.Attempt]]


@dataclass(frozen=True)
class NotifyConfig:
    secret: str
    private_addresses: bool = DEFAULTS["METEORSEED_NOTIFY_PRIVATE_ADDRESSES"]
    attempts: int = DEFAULTS["METEORSEED_NOTIFY_ATTEMPTS"]
    backoff: Backoff = field(default_factory=lambda: Backoff(
        DEFAULTS["METEORSEED_NOTIFY_BACKOFF_BASE"], DEFAULTS["METEORSEED_NOTIFY_BACKOFF_MAX"]))
    timeout: float = DEFAULTS["METEORSEED_NOTIFY_TIMEOUT"]
    concurrency: int = DEFAULTS["METEORSEED_NOTIFY_CONCURRENCY"]
    claim_idle: float = DEFAULTS["METEORSEED_NOTIFY_CLAIM_IDLE"]

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> NotifyConfig:
        """The ``METEORSEED_NOTIFY_*`` settings; an invalid one raises ConfigError naming it."""
        base = duration_setting(settings, "METEORSEED_NOTIFY_BACKOFF_BASE", positive=True)
        cap = duration_setting(settings, "METEORSEED_NOTIFY_BACKOFF_MAX", positive=True)
        if cap < base:
            raise ConfigError("METEORSEED_NOTIFY_BACKOFF_MAX", "must not be below "
                              f"METEORSEED_NOTIFY_BACKOFF_BASE ({cap:g} < {base:g})")
        timeout = duration_setting(settings, "METEORSEED_NOTIFY_TIMEOUT", positive=True)
        claim_idle = duration_setting(settings, "METEORSEED_NOTIFY_CLAIM_IDLE", positive=True)
        if claim_idle <= timeout:
            raise ConfigError("METEORSEED_NOTIFY_CLAIM_IDLE", "must be longer than "
                              f"METEORSEED_NOTIFY_TIMEOUT ({claim_idle:g} <= {timeout:g}): a "
                              "call still under way would be taken over and sent twice")
        return cls(
            secret=str(setting(settings, SECRET_SETTING)),
            private_addresses=flag_setting(settings, webhook.PRIVATE_SETTING),
            attempts=integer_setting(settings, "METEORSEED_NOTIFY_ATTEMPTS", minimum=1),
            backoff=Backoff(base, cap),
            timeout=timeout,
            concurrency=integer_setting(settings, "METEORSEED_NOTIFY_CONCURRENCY", minimum=1),
            claim_idle=claim_idle,
        )

    @property
    def enabled(self) -> bool:
        """No secret, no webhook: an unsigned call could not be told from a forged one."""
        return bool(self.secret)


def payload(event: Event, namespace: str) -> bytes:
    """The JSON body of a ``finished`` event's call."""
    counters = event.json_field("counters")
    at = event.fields.get("at")
    return json.dumps({
        "event": "finished", "seed_id": event.fields.get("seed"),
        "counters": counters if isinstance(counters, dict) else {},
        "finished_at": float(at) if at else None, "namespace": namespace,
    }, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def delivery_id(event: Event, namespace: str) -> str:
    """The same for every attempt of one call, and for a seed run announced twice (two
    workers settling its last tasks in two shards): its namespace, seed, run and start
    (hashed: the header carries no text of the caller's); else the event's stream id."""
    counters = event.json_field("counters")
    run = counters.get("run") if isinstance(counters, dict) else None
    started = counters.get("started_at") if isinstance(counters, dict) else None
    if run is None and started is None:
        return event.id
    key = json.dumps([namespace, event.fields.get("seed"), run, started])
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def default_consumer() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Deliverer:
    """Delivers the webhooks of one namespace until cancelled (:meth:`run`)."""

    def __init__(self, client: AsyncRedis, keys: KeyLayout, config: NotifyConfig,
                 notify_url: NotifyLookup, consumer: str | None = None,
                 post: Post = webhook.post, read_block_ms: int = READ_BLOCK_MS) -> None:
        self.client, self.keys, self.config = client, keys, config
        self.notify_url, self.post, self.read_block_ms = notify_url, post, read_block_ms
        self.reader = EventReader(client, keys.events, GROUP, consumer or default_consumer())
        self._busy: dict[str, asyncio.Task[None]] = {}  # entry id -> its delivery
        self._started = False
        self._calls: set[asyncio.Future[Any]] = set()  # Redis commands under way

    async def run(self) -> None:
        """Read, deliver, acknowledge; cancelled, the calls under way stop unacknowledged."""
        failures = 0
        try:
            while True:
                try:
                    if failures or not self._started:
                        await self._redis(self.reader.create_group("0"))
                        self._started = True
                    await self.step()
                    failures = 0
                except REDIS_FAILURES as exc:  # Redis down: wait, read again
                    failures += 1
                    delay = self.config.backoff.compute(failures - 1)
                    logger.warning("Webhooks: cannot read %s (%s); again in %.1f s",
                                   self.keys.events, exc, delay)
                    await asyncio.sleep(delay)
        finally:
            for task in self._busy.values():
                task.cancel()
            await asyncio.gather(*self._busy.values(), return_exceptions=True)
            if self._calls:  # (a read blocks read_block_ms at most)
                await asyncio.wait(self._calls, timeout=self.read_block_ms / 1000 + 5)

    async def _redis(self, call: Awaitable[T]) -> T:
        """``await call``, a Redis command, shielded: cancelling a redis-py command in flight
        can leave the cancellation swallowed and the task running (redis-py 8.2), so a
        cancelled deliverer stops waiting at once and the command ends by itself (awaited
        when :meth:`run` ends)."""
        task = asyncio.ensure_future(call)
        self._calls.add(task)
        task.add_done_callback(self._call_done)
        return await asyncio.shield(task)

    def _call_done(self, task: asyncio.Future[Any]) -> None:
        self._calls.discard(task)
        if not task.cancelled():
            task.exception()  # (retrieved: whoever still waits got it; nobody else needs it)

    async def step(self) -> None:
        """One round: take over stale entries, else read new ones, and start their calls."""
        free = self.config.concurrency - len(self._busy)
        if free <= 0:
            await asyncio.wait(list(self._busy.values()), return_when=asyncio.FIRST_COMPLETED)
            return
        claimed, gone = await self._redis(self.reader.claim(self.config.claim_idle, free))
        if gone:
            logger.warning("Webhooks: %d pending events were trimmed from %s before delivery",
                           len(gone), self.keys.events)
            await self._redis(self.reader.ack(*gone))
        fresh = [e for e in claimed if e.id not in self._busy]
        if not fresh:
            fresh = await self._redis(self.reader.read(free, self.read_block_ms))
        for event in fresh:
            task = asyncio.ensure_future(self.handle(event))
            self._busy[event.id] = task
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        for entry_id, running in list(self._busy.items()):
            if running is task:
                del self._busy[entry_id]
        if not task.cancelled() and (exc := task.exception()) is not None:
            # (left pending: taken over again after the claim time)
            logger.warning("Webhooks: an event could not be handled (%s); it is retried "
                           "after %g s", exc, self.config.claim_idle)

    async def handle(self, event: Event) -> None:
        """Deliver ``event`` if it is a ``finished`` with a webhook, then acknowledge it."""
        seed = event.fields.get("seed")
        url = (await self._redis(self.notify_url(seed))
               if event.event == CrawlEvent.FINISHED.value and seed else None)
        if url is not None:
            await self.deliver(event, seed or "", url)
        await self._redis(self.reader.ack(event.id))

    async def deliver(self, event: Event, seed: str, url: str) -> None:
        body = payload(event, self.keys.namespace)
        delivery = delivery_id(event, self.keys.namespace)
        outcome = webhook.Attempt(None, False, "not attempted")
        attempt = 0
        while attempt < self.config.attempts:
            attempt += 1
            stamp = str(int(time.time()))
            headers = {"Content-Type": "application/json", "User-Agent": "meteorseed-notify",
                       webhook.TIMESTAMP_HEADER: stamp, webhook.DELIVERY_HEADER: delivery,
                       webhook.SIGNATURE_HEADER: webhook.sign(
                           self.config.secret.encode("utf-8"), stamp, body)}
            outcome = await self.post(url, body, headers, timeout=self.config.timeout,
                                      private_addresses=self.config.private_addresses)
            if outcome.ok:
                logger.info("Webhook of seed %s delivered to %s (%s, attempt %d)", seed, url,
                            outcome.status, attempt)
                await self._redis(events.append_async(
                    self.client, self.keys.events, CrawlEvent.NOTIFY_DELIVERED, seed=seed,
                    url=url, status=outcome.status, attempts=attempt))
                return
            if not outcome.retry or attempt >= self.config.attempts:
                break
            delay = self.config.backoff.compute(attempt - 1, outcome.retry_after)
            logger.info("Webhook of seed %s to %s: %s; attempt %d again in %.1f s", seed, url,
                        outcome.reason, attempt + 1, delay)
            await self._hold(event.id, delay)
        logger.warning("Webhook of seed %s to %s given up after %d attempts: %s", seed, url,
                       attempt, outcome.reason)
        await self._redis(events.append_async(
            self.client, self.keys.events, CrawlEvent.NOTIFY_FAILED, seed=seed, url=url,
            reason=outcome.reason, attempts=attempt))

    async def _hold(self, entry_id: str, delay: float) -> None:
        """Wait ``delay`` seconds keeping ``entry_id`` fresh, so no other deliverer takes it."""
        end = time.monotonic() + delay
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, self.config.claim_idle / 3))
            await self._redis(self.reader.keep(entry_id))


def registry_lookup(get_seed: Callable[[str], Awaitable[Any]]) -> NotifyLookup:
    """A :data:`NotifyLookup` from the seed registry's ``get`` (a record with ``.seed``)."""
    async def lookup(seed_id: str) -> str | None:
        record = await get_seed(seed_id)
        return None if record is None else record.seed.notify

    return lookup


__all__ = ["GROUP", "Deliverer", "NotifyConfig", "NotifyLookup", "delivery_id", "payload",
           "registry_lookup"]

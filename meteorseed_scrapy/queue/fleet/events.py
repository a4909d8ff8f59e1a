"""The namespace's crawl events, ``<ns>:events``: one Redis stream other programs read with a
consumer group of their own (docs/events.md).

Each entry is flat text: ``event`` (a :class:`CrawlEvent` value), ``at`` (epoch seconds,
``"%.3f"``), the subject (``site`` or ``seed``), ``by`` for an operator's action, and any other
field, JSON-encoded unless it is text (``counters`` of ``finished`` is a JSON object). The
stream is capped at :data:`EVENTS_KEPT` entries (``MAXLEN ~``): a reader that falls further
behind loses the oldest. Lua scripts may XADD the same fields themselves.

This module sits in ``queue/`` so that every layer that tells of an event (politeness, the
worker, seeding, the API) can append through it.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.task.json_depth import loads_bounded

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis, SyncRedis

logger = logging.getLogger(__name__)

#: Events kept in ``<ns>:events`` (approximately: MAXLEN ~).
EVENTS_KEPT = 10_000


class CrawlEvent(str, enum.Enum):
    """The events of ``<ns>:events`` (the value is what the ``event`` field holds)."""

    STARTED = "started"  # a seed's first task was enqueued (field seed)
    FINISHED = "finished"  # nothing of a seed is left anywhere (seed, counters)
    SITE_PAUSED = "site paused"  # site, by, reason
    SITE_RESUMED = "site resumed"  # site, by, woken
    SITE_LIMITED = "site limited"  # site, by, rate, concurrency
    SITE_LIMITS_RESET = "site limits reset"  # site, by
    SEED_PAUSED = "seed paused"  # seed, by, reason
    SEED_RESUMED = "seed resumed"  # seed, by, woken
    SEED_CANCELLED = "seed cancelled"  # seed, by, waiting, delayed (tasks removed)
    NOTIFY_DELIVERED = "notify delivered"  # seed, url, status, attempts
    NOTIFY_FAILED = "notify failed"  # seed, url, reason, attempts


def entry(event: CrawlEvent | str, fields: Mapping[str, Any], at: float | None = None
          ) -> dict[str, str]:
    """The stream entry of ``event``: ``at`` now unless given, None values left out, the rest
    JSON-encoded unless text."""
    name = event.value if isinstance(event, CrawlEvent) else event
    body = {"event": name, "at": f"{time.time() if at is None else at:.3f}"}
    for key, value in fields.items():
        if value is not None:
            body[key] = value if isinstance(value, str) else json.dumps(value)
    return body


def append(client: SyncRedis, stream: str, event: CrawlEvent | str,
           **fields: Any) -> str:
    """XADD ``event`` to ``stream`` (``KeyLayout.events``); its entry id."""
    return text_of(client.xadd(stream, entry(event, fields),  # type: ignore[arg-type]
                               maxlen=EVENTS_KEPT, approximate=True))


async def append_async(client: AsyncRedis, stream: str, event: CrawlEvent | str,
                       **fields: Any) -> str:
    """:func:`append` for an asyncio client."""
    return text_of(await client.xadd(stream, entry(event, fields),  # type: ignore[arg-type]
                                     maxlen=EVENTS_KEPT, approximate=True))


@dataclass(frozen=True)
class Event:
    """One entry read back: its stream id, its ``event`` and its other fields (as text)."""

    id: str
    event: str
    fields: dict[str, str]
    #: each field decoded once, so that a bad one is reported once however often it is read
    _decoded: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                     compare=False)

    def json_field(self, name: str) -> Any:
        """Field ``name`` decoded from JSON (None when absent, or not JSON nested at most
        ``json_depth.MAX_DEPTH`` levels: any process may append to the stream)."""
        if name not in self._decoded:
            self._decoded[name] = self._decode(name)
        return self._decoded[name]

    def _decode(self, name: str) -> Any:
        raw = self.fields.get(name)
        if raw is None:
            return None
        try:
            return loads_bounded(name, raw)
        except ValueError as exc:
            logger.warning("Event %s: field %s read as absent (%s)", self.id, name, str(exc)[:300])
            return None


def _event(entry_id: Any, raw: Mapping[Any, Any] | None) -> Event | None:
    if not raw:  # trimmed away while pending (so Redis 6.2's XAUTOCLAIM answers: no fields)
        return None
    fields = {text_of(k): text_of(v) for k, v in raw.items()}
    return Event(text_of(entry_id), fields.pop("event", ""), fields)


class EventReader:
    """A consumer ``consumer`` of group ``group`` on the events stream (asyncio): read new
    entries, take over those another consumer left pending, acknowledge.

    An entry read and never acknowledged stays pending in the group; :meth:`claim` hands it
    to another consumer once it has been idle ``claim_idle`` seconds (at least once)."""

    def __init__(self, client: AsyncRedis, stream: str, group: str,
                 consumer: str) -> None:
        self.client, self.stream, self.group, self.consumer = client, stream, group, consumer
        self._cursor = "0-0"

    async def create_group(self, start: str = "0") -> bool:
        """XGROUP CREATE ... MKSTREAM from ``start`` ("0": every entry still kept, "$": new
        ones only); False when the group exists already."""
        try:
            await self.client.xgroup_create(self.stream, self.group, id=start, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        return True

    async def read(self, count: int, block_ms: int | None = None) -> list[Event]:
        """Up to ``count`` new entries (XREADGROUP ``>``), waiting up to ``block_ms``."""
        reply: Any = await self.client.xreadgroup(self.group, self.consumer,
                                                  {self.stream: ">"}, count=count,
                                                  block=block_ms)
        out: list[Event] = []
        for _stream, entries in reply or ():
            out.extend(e for i, f in entries if (e := _event(i, f)) is not None)
        return out

    async def claim(self, claim_idle: float, count: int) -> tuple[list[Event], list[str]]:
        """Entries pending for other consumers idle ``claim_idle`` s (XAUTOCLAIM, resuming
        where the last call stopped), and ids pending that the stream no longer holds (to be
        acknowledged)."""
        reply = await self.client.xautoclaim(self.stream, self.group, self.consumer,
                                             int(claim_idle * 1000), self._cursor, count=count)
        self._cursor = text_of(reply[0])
        # Redis 7 lists the ids it dropped from the group; 6.2 answers nil in an entry's place
        # (its id unknown: it stays pending, claimed again each time, until the group goes).
        events, gone = [], [text_of(i) for i in (reply[2] if len(reply) > 2 else ())]
        for entry_id, raw in reply[1]:
            event = _event(entry_id, raw)
            if event is not None:
                events.append(event)
            elif entry_id is not None:
                gone.append(text_of(entry_id))
        return events, gone

    async def keep(self, entry_id: str) -> None:
        """Reset ``entry_id``'s idle time (XCLAIM to self): still being handled here."""
        await self.client.xclaim(self.stream, self.group, self.consumer, 0, [entry_id],
                                 justid=True)

    async def ack(self, *entry_ids: str) -> None:
        if entry_ids:
            await self.client.xack(self.stream, self.group, *entry_ids)


__all__ = ["EVENTS_KEPT", "CrawlEvent", "Event", "EventReader", "append", "append_async",
           "entry"]

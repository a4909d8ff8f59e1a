"""What became of each URL a worker settled, kept for a retention and bounded per site: the
task history that ``meteorseed task URL`` reads after the task left every stream.

One record per URL (its dedup fingerprint's first 6 bytes, as the dedup layer keys it) in the
site's history (``lua/history_lib.lua``; key layout in :mod:`~meteorseed_scrapy.queue.keys`):
the outcome (done with its items, gone with its 404/410, robots, blacklist, other ignored,
dead with the start of its reason, cancelled), when, and which consumer. The newest record of a
URL replaces the one before. ``METEORSEED_TASK_HISTORY_RETENTION`` (default 7 days; 0 = none
kept) is how long a record is kept at least, ``METEORSEED_TASK_HISTORY_PER_SITE`` how many
records a site keeps at most (the oldest generation goes first). A record costs about 30 bytes
of Redis (``benchmarks/left_per_url.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.queue.plumbing.scripts import register
from meteorseed_scrapy.queue.shards import call_scripts
from meteorseed_scrapy.settings import duration_setting, integer_setting
from meteorseed_scrapy.task.exceptions import IGNORED_PREFIX, ROBOTS_MESSAGE, Blacklisted
from meteorseed_scrapy.task.exec_task import ExecTask

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript, Script

    from meteorseed_scrapy.queue.plumbing.connection import AnyRedis, AsyncRedis, SyncRedis
    from meteorseed_scrapy.queue.plumbing.scripts import AnyScript
    from meteorseed_scrapy.settings import SettingsSource

#: The client a history writes with: :meth:`TaskHistory.write` needs an asyncio one,
#: :meth:`TaskHistory.write_sync` a blocking one (an operator's command).
C = TypeVar("C", bound="AnyRedis")

#: Outcome name -> its code in a record (``lua/history_lib.lua``).
CODES = {"done": "d", "gone": "g", "robots": "r", "blacklisted": "b", "ignored": "i",
         "dead": "x", "cancelled": "c"}
OUTCOMES = {code: name for name, code in CODES.items()}
#: Bytes of a reason kept in a record (the dead letter keeps the whole of it).
REASON_BYTES = 40
#: Records written per script call.
BATCH = 500
#: Seconds a worker's queued task ends wait at most for a batch to fill.
EVERY_S = 1.0


#: An ignored task's reason when Scrapy's RobotsTxtMiddleware refused its request, and the
#: start of one when a site's blacklist did: matched whole, as another reason may quote a URL
#: holding either.
ROBOTS_REASON = IGNORED_PREFIX + ROBOTS_MESSAGE
BLACKLISTED_REASON = IGNORED_PREFIX + Blacklisted.PREFIX


def outcome_name(outcome: str, reason: str = "") -> str:
    """The history's name for how a task ended: a worker's outcome (``done``, ``gone``,
    ``ignored``, ``dead``) with an ignored task told apart by its reason (robots.txt, a site's
    blacklist)."""
    if outcome != "ignored":
        return outcome
    if reason == ROBOTS_REASON:
        return "robots"
    if reason.startswith(BLACKLISTED_REASON):
        return "blacklisted"
    return "ignored"


def _short(reason: str) -> str:
    """At most :data:`REASON_BYTES` bytes of ``reason``, cut at a character boundary, commas
    (the record's separators) kept."""
    data = reason.encode("utf-8")[:REASON_BYTES]
    return data.decode("utf-8", "ignore")


@dataclass(frozen=True)
class HistoryEntry:
    """One task's end, to be recorded in its site's history."""

    site_id: str
    fingerprint: bytes
    outcome: str  # a key of CODES
    consumer: str
    items: int = 0
    status: int = 0
    reason: str = ""

    @classmethod
    def of(cls, task: ExecTask, fingerprint: bytes, outcome: str, consumer: str, *,
           items: int = 0, status: int = 0, reason: str = "") -> HistoryEntry:
        if outcome not in CODES:
            raise ValueError(f"unknown history outcome {outcome!r}")
        kept = "" if outcome in ("done", "robots", "blacklisted") else _short(reason)
        return cls(task.site_id, fingerprint, outcome, consumer, items, status, kept)

    def args(self) -> list[Any]:
        return [self.fingerprint[:6], CODES[self.outcome], self.items, self.status,
                self.consumer, self.reason]


def decode_record(reply: Any) -> dict[str, Any] | None:
    """``history_get.lua``'s reply as ``{"outcome", "at", "items", "status", "consumer",
    "reason"}``; None when there is none (or it cannot be read)."""
    if not reply or len(reply) < 3:
        return None
    value, start, consumer = (text_of(part) for part in reply[:3])
    head, *rest = value.split(",", 4)
    outcome = OUTCOMES.get(head[:1])
    try:
        offset, items, status = int(head[1:]), int(rest[0]), int(rest[1])
        at = float(int(start) + offset)
    except (ValueError, IndexError):
        return None
    if outcome is None:
        return None
    return {"outcome": outcome, "at": at, "items": items, "status": status or None,
            "consumer": consumer or None, "reason": rest[3] if len(rest) > 3 else None}


class TaskHistory(Generic[C]):
    """Writes task ends to their sites' histories (one script call per site and batch)."""

    def __init__(self, redis: C, keys: KeyLayout, retention_s: float, per_site: int) -> None:
        self.redis = redis
        self.keys = keys
        self.retention_s = retention_s
        self.per_site = per_site
        # (of redis's kind: a Script on a blocking client, an AsyncScript on an asyncio one)
        self._add: AnyScript = register(redis, "history_add")

    @staticmethod
    def settings_of(settings: SettingsSource) -> tuple[float, int]:
        """``METEORSEED_TASK_HISTORY_RETENTION`` (a duration; 0: none kept) and
        ``METEORSEED_TASK_HISTORY_PER_SITE`` (>= 1); a bad value is a ConfigError naming it."""
        return (duration_setting(settings, "METEORSEED_TASK_HISTORY_RETENTION"),
                integer_setting(settings, "METEORSEED_TASK_HISTORY_PER_SITE", minimum=1))

    @classmethod
    def from_settings(cls, settings: SettingsSource, redis: C, keys: KeyLayout
                      ) -> TaskHistory[C]:
        return cls(redis, keys, *cls.settings_of(settings))

    @property
    def active(self) -> bool:
        return self.retention_s > 0

    def calls(self, entries: Sequence[HistoryEntry]) -> list[tuple[list[str], list[Any]]]:
        """``history_add.lua`` calls for ``entries``: one per site and :data:`BATCH`."""
        by_site: dict[str, list[HistoryEntry]] = {}
        for entry in entries:
            by_site.setdefault(entry.site_id, []).append(entry)
        out = []
        head = [max(1, round(self.retention_s)), self.per_site]
        for site, group in by_site.items():
            for i in range(0, len(group), BATCH):
                args = list(head)
                for entry in group[i:i + BATCH]:
                    args += entry.args()
                out.append(([self.keys.history(site)], args))
        return out

    def write_sync(self: TaskHistory[SyncRedis], entries: Sequence[HistoryEntry]) -> int:
        """:meth:`write` on a synchronous client (an operator's command)."""
        if not entries or not self.active:
            return 0
        add = cast("Script", self._add)
        return sum(int(add(keys=keys, args=args)) for keys, args in self.calls(entries))

    async def write(self: TaskHistory[AsyncRedis], entries: Sequence[HistoryEntry]) -> int:
        """Record ``entries`` (nothing when the retention is 0); how many were written."""
        if not entries or not self.active:
            return 0
        add = cast("AsyncScript", self._add)
        replies = await call_scripts(self.redis, add, self.calls(entries))
        return sum(int(n) for n in replies)


class HistoryQueue:
    """A worker's task ends on their way to their sites' histories, written in few calls: once
    a batch is full, once the oldest waited :data:`EVERY_S` (the worker's flush loop wakes at
    least that often), or when the worker stops. Nothing is queued when no history is kept."""

    def __init__(self, history: TaskHistory | None, fingerprint: Callable[[ExecTask], bytes],
                 consumer: str) -> None:
        self.history = history if history is not None and history.active else None
        self._fingerprint = fingerprint  # the dedup key (the project's fingerprinter's)
        self._consumer = consumer
        self.ends: list[HistoryEntry] = []
        self._since = 0.0  # (monotonic) when the oldest of them was queued

    def __bool__(self) -> bool:
        return bool(self.ends)

    def entry(self, task: ExecTask, outcome: str, *, items: int = 0, status: int = 0,
              reason: str = "", fingerprint: bytes | None = None) -> HistoryEntry | None:
        """``task``'s end as its site's history records it (``outcome``: a worker's, see
        :func:`outcome_name`; ``fingerprint``: its dedup key when the caller has it already);
        None when no history is kept or the task has no dedup key."""
        if self.history is None:
            return None
        if fingerprint is None:
            try:
                fingerprint = self._fingerprint(task)
            except ValueError:
                return None
        return HistoryEntry.of(task, fingerprint, outcome_name(outcome, reason), self._consumer,
                               items=items, status=status, reason=reason)

    def add(self, task: ExecTask, outcome: str, *, items: int = 0, status: int = 0,
            reason: str = "", fingerprint: bytes | None = None) -> None:
        entry = self.entry(task, outcome, items=items, status=status, reason=reason,
                           fingerprint=fingerprint)
        if entry is not None:
            if not self.ends:
                self._since = time.monotonic()
            self.ends.append(entry)

    def due(self, closing: bool) -> bool:
        return bool(self.ends) and (len(self.ends) >= BATCH or closing
                                    or time.monotonic() - self._since >= EVERY_S)

    async def write_batch(self) -> None:
        """Write the oldest :data:`BATCH` of the queued ends (kept queued when that fails)."""
        batch = self.ends[:BATCH]
        await self.write(batch)
        del self.ends[: len(batch)]
        self._since = time.monotonic()

    async def write(self, entries: Sequence[HistoryEntry]) -> None:
        if self.history is not None:
            await self.history.write(entries)


__all__ = ["CODES", "HistoryEntry", "HistoryQueue", "TaskHistory", "decode_record",
           "outcome_name"]

"""The delayed set's entries: which site a deferred task is for, why it waits, when it is due.

A member is ``<lane>:<band>|<task message JSON>`` (``lua/defer.lua``; a bare JSON member from
before lanes goes to ``<ns>:tasks``) and its score the due time in ms, Redis TIME. Why the task
waits is recorded in the score's fraction: ``due_ms - 1 + code / 16``, which ``promote.lua``
(moving the entries whose score is at most the current whole ms) moves exactly when it would
move ``due_ms``: the due time is the score rounded up. The member is unchanged, so every
version's ``promote.lua`` moves a new entry to the right stream at the right time, and an entry
without a reason (a whole score: deferred by an older version) reads as ``unknown``. A double
holds whole ms plus 1/16ths exactly until the year 10000 and beyond.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.json_depth import loads_bounded
from meteorseed_scrapy.task.validation import TaskError, check_id

#: What an entry without a recorded reason (or with a fraction that is not one) reads as.
UNKNOWN = "unknown"
#: The fraction's denominator: codes 1..15 fit; 0 is "no reason recorded".
SCALE = 16
#: Each reason's code in the score (stored in Redis: never renumber one).
REASON_CODES: dict[DeferReason, int] = {
    DeferReason.RETRY: 1, DeferReason.PAUSED: 2, DeferReason.SICK: 3,
    DeferReason.PRIORITY: 4, DeferReason.QUOTA: 5, DeferReason.OTHER: 6,
}
_REASONS = {code: why.value for why, code in REASON_CODES.items()}


def reason_code(why: DeferReason) -> int:
    """The code ``defer.lua`` records (divided by :data:`SCALE`) in the score's fraction."""
    return REASON_CODES[DeferReason(why)]


def reason_of(score: float) -> str:
    """The reason recorded in a delayed-set score, or :data:`UNKNOWN`."""
    if not math.isfinite(score):
        return UNKNOWN
    code = (score - math.floor(score)) * SCALE
    if code != int(code):  # not k/16: not written by defer.lua
        return UNKNOWN
    return _REASONS.get(int(code), UNKNOWN)


def due_at(score: float) -> float | None:
    """The due time of a score, epoch seconds (the score rounded up to a whole ms, when
    ``promote.lua`` moves it); None for ``+inf`` (never due)."""
    if score == math.inf:
        return None
    return max(0.0, math.ceil(score) / 1000) if math.isfinite(score) else 0.0


def site_of(member: str | bytes) -> str | None:
    """The site of a delayed-set member's task; None when its message is not a task's JSON
    with a valid ``site_id`` (a damaged entry: reported, never guessed)."""
    text = text_of(member)
    message = text
    if not text.startswith("{"):  # as promote.lua reads it: the route ends at the first '|'
        _, bar, rest = text.partition("|")
        if bar:
            message = rest
    try:
        data = loads_bounded("task", message)
    except ValueError:
        return None
    site = data.get("site_id") if isinstance(data, dict) else None
    try:
        return check_id("site_id", site)
    except TaskError:
        return None


@dataclass(frozen=True)
class DelayedEntry:
    site_id: str | None
    why: str
    due_at: float | None  # epoch seconds; None: never due (score +inf)

    @classmethod
    def parse(cls, member: str | bytes, score: float) -> DelayedEntry:
        return cls(site_of(member), reason_of(score), due_at(score))


__all__ = ["REASON_CODES", "SCALE", "UNKNOWN", "DelayedEntry", "due_at", "reason_code",
           "reason_of", "site_of"]

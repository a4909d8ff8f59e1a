"""A registered seed as read back from Redis: its definition plus its run state."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.task.json_depth import loads_bounded
from meteorseed_scrapy.task.lanes import DEFAULT_LANE
from meteorseed_scrapy.task.seed_task import SeedTask

logger = logging.getLogger(__name__)


def seed_to_dict(seed: SeedTask) -> dict[str, Any]:
    """``seed`` as its JSON line would hold it (defaults left out)."""
    out: dict[str, Any] = {"seed_id": seed.seed_id, "site_id": seed.site_id,
                           "task_type": seed.task_type, "payload": dict(seed.payload)}
    if seed.priority:
        out["priority"] = seed.priority
    for name in ("schedule", "parse_rule", "callback", "spider", "notify"):
        if getattr(seed, name) is not None:
            out[name] = getattr(seed, name)
    if seed.meta:
        out["meta"] = dict(seed.meta)
    if seed.lane != DEFAULT_LANE:
        out["lane"] = seed.lane
    return out


@dataclass(frozen=True)
class SeedRecord:
    """A seed's definition plus its run state (times are epoch seconds, Redis clock)."""

    seed: SeedTask
    added_at: float
    last_run: float | None
    last_success: float | None
    last_error: str | None  # of the last run; None once a run succeeds
    last_yield: int | None  # new URLs of the last run (not duplicates), workers' children too
    runs: int
    failures: int  # consecutive failed runs (0 after a success)
    next_due: float | None  # None: not scheduled (a one-shot seed that ran)
    interval_s: float | None  # the adaptive interval in use (every schedules)
    updated_at: float | None = None
    rev: int = 0  # definition revision, + 1 on each change
    last_enqueued: int | None = None
    last_duplicates: int | None = None
    last_rejected: int | None = None
    yield_rate: float | None = None  # EWMA of new URLs per hour
    pending_yield: int = 0  # children counted by workers since the last run

    @property
    def seed_id(self) -> str:
        return self.seed.seed_id

    @property
    def status(self) -> str:
        """``new`` (never run), ``ok`` or ``failing``."""
        if self.failures:
            return "failing"
        return "ok" if self.runs else "new"

    def to_json(self) -> dict[str, Any]:
        """JSON-safe, for the API and ``status --json``."""
        out: dict[str, Any] = {"seed_id": self.seed.seed_id, "site_id": self.seed.site_id,
                               "status": self.status, "seed": seed_to_dict(self.seed)}
        for f in fields(self):
            if f.name != "seed":
                out[f.name] = getattr(self, f.name)
        return out


def _float(raw: Mapping[str, str], name: str) -> float | None:
    value = raw.get(name)
    return None if value is None or value == "" else float(value)


def _int(raw: Mapping[str, str], name: str) -> int | None:
    value = raw.get(name)
    return None if value is None or value == "" else int(value)


def record_from_hash(seed_id: str, hash_: Mapping[Any, Any], due: Any,
                     pending: Any) -> SeedRecord | None:
    """The record of a seed's hash (None when it was deleted or cannot be read)."""
    raw = {text_of(k): text_of(v) for k, v in hash_.items()}
    if "def" not in raw:
        return None  # deleted between the index read and this one
    try:
        seed = SeedTask.from_dict(loads_bounded("def", raw["def"]))
    except (ValueError, TypeError) as exc:  # written by an older/newer version: say which
        logger.error("seed %s: stored definition is unreadable (%s)", seed_id, exc)
        return None
    return SeedRecord(
        seed=seed, added_at=_float(raw, "added_at") or 0.0,
        last_run=_float(raw, "last_run"), last_success=_float(raw, "last_success"),
        last_error=raw.get("last_error") or None, last_yield=_int(raw, "last_yield"),
        runs=_int(raw, "runs") or 0, failures=_int(raw, "failures") or 0,
        next_due=None if due is None else float(due), interval_s=_float(raw, "interval_s"),
        updated_at=_float(raw, "updated_at"), rev=_int(raw, "rev") or 0,
        last_enqueued=_int(raw, "last_enqueued"), last_duplicates=_int(raw, "last_duplicates"),
        last_rejected=_int(raw, "last_rejected"), yield_rate=_float(raw, "rate"),
        pending_yield=int(pending or 0),
    )


__all__ = ["SeedRecord", "record_from_hash", "seed_to_dict"]

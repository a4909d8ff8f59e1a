"""A seed's ``schedule``: validated value objects, parsed from the seed's JSON.

Accepted forms (see docs/seeding.md):

* ``"every 30m"`` or ``{"every": "30m"}``: an interval (a duration of
  :func:`meteorseed_scrapy.validators.parse_duration`: ``45s``, ``30m``, ``2h``, ``1d``, ``2w``,
  ``1h30m`` or a number of seconds), the *starting* interval of an adaptive schedule. The
  object form also takes ``min`` and ``max`` (bounds of the adaptation), ``target`` (new URLs
  per run the adaptation aims at) and ``adaptive`` (``false``: always exactly ``every``).
* ``"*/15 * * * *"``, ``"@hourly"`` or ``{"cron": "0 6 * * mon-fri", "tz": "Europe/Berlin"}``:
  a standard 5-field cron expression (:mod:`meteorseed_scrapy.seeding.cron`), fired on its
  expression, never adapted.

Every error is a :class:`~meteorseed_scrapy.task.validation.TaskError` whose field starts with
``schedule``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from meteorseed_scrapy.seeding.cron import CronExpr
from meteorseed_scrapy.task.validation import TaskError, check_known_keys
from meteorseed_scrapy.validators import ConfigError, format_duration, parse_duration

FIELD = "schedule"
#: Shortest accepted interval (and bound), seconds.
MIN_EVERY = 1.0
#: Longest accepted interval (and bound): a year.
MAX_EVERY = 366 * 86400.0
#: New URLs per run the adaptation aims at unless the schedule says ``target``.
DEFAULT_TARGET = 10.0
_EVERY_TEXT = re.compile(r"^\s*every\s+(.+)$", re.IGNORECASE)
_EVERY_KEYS = frozenset({"every", "min", "max", "target", "adaptive"})
_CRON_KEYS = frozenset({"cron", "tz"})


def parse_interval(value: Any, field: str) -> float:
    """Seconds of a schedule interval or bound: the one duration grammar
    (:func:`meteorseed_scrapy.validators.parse_duration`), from 1 s to 366 days;
    :class:`TaskError` naming ``field`` otherwise."""
    try:
        seconds = parse_duration(value, field)
    except ConfigError as exc:
        raise TaskError(field, exc.problem) from None
    if not MIN_EVERY <= seconds <= MAX_EVERY:
        raise TaskError(field, f"must be between {MIN_EVERY:g} s and 366 days, got "
                        f"{value!r}"[:200])
    return seconds


@dataclass(frozen=True)
class Every:
    """Run about every ``seconds``, adapting to yield between ``min_s`` and ``max_s`` (None:
    the site's or the settings' bound)."""

    seconds: float
    min_s: float | None = None
    max_s: float | None = None
    target: float = DEFAULT_TARGET
    adaptive: bool = True

    def describe(self) -> str:
        return f"every {format_duration(self.seconds)}" + ("" if self.adaptive else " (fixed)")


@dataclass(frozen=True)
class Cron:
    """Run at the fire times of ``expr``, in zone ``tz`` (None: UTC)."""

    expr: CronExpr
    tz: str | None = None

    def next_after(self, after: float) -> float:
        return self.expr.next_after(after, ZoneInfo(self.tz) if self.tz else None)

    def describe(self) -> str:
        return f"cron {self.expr.text}" + (f" ({self.tz})" if self.tz else "")


Schedule = Every | Cron


def _every(value: dict[str, Any]) -> Every:
    check_known_keys(value, _EVERY_KEYS, FIELD, "a schedule field")
    seconds = parse_interval(value["every"], f"{FIELD}.every")
    low = parse_interval(value["min"], f"{FIELD}.min") if "min" in value else None
    high = parse_interval(value["max"], f"{FIELD}.max") if "max" in value else None
    if low is not None and high is not None and low > high:
        raise TaskError(f"{FIELD}.min", f"is above max ({low:g} s > {high:g} s)")
    target = value.get("target", DEFAULT_TARGET)
    if isinstance(target, bool) or not isinstance(target, (int, float)) or target <= 0:
        raise TaskError(f"{FIELD}.target", f"must be a positive number of new URLs per run, "
                        f"got {target!r}"[:200])
    adaptive = value.get("adaptive", True)
    if not isinstance(adaptive, bool):
        raise TaskError(f"{FIELD}.adaptive", f"must be true or false, got {adaptive!r}"[:200])
    return Every(seconds, low, high, float(target), adaptive)


def _cron(value: dict[str, Any]) -> Cron:
    check_known_keys(value, _CRON_KEYS, FIELD, "a schedule field")
    expr = CronExpr.parse(value["cron"], f"{FIELD}.cron")
    tz = value.get("tz")
    if tz is not None:
        if not isinstance(tz, str) or not tz:
            raise TaskError(f"{FIELD}.tz", f"must be a time zone name, got {tz!r}"[:200])
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise TaskError(f"{FIELD}.tz", f"unknown time zone {tz!r}"[:200]) from None
    return Cron(expr, tz)


def parse_schedule(value: Any) -> Schedule | None:
    """The schedule of a seed (None: the seed runs once); raises :class:`TaskError`."""
    if value is None:
        return None
    if isinstance(value, str):
        match = _EVERY_TEXT.match(value)
        if match:
            return _every({"every": match.group(1).strip()})
        return Cron(CronExpr.parse(value, FIELD))
    if isinstance(value, dict):
        if "every" in value and "cron" in value:
            raise TaskError(FIELD, "give every or cron, not both")
        if "every" in value:
            return _every(value)
        if "cron" in value:
            return _cron(value)
        raise TaskError(FIELD, "needs every (an interval) or cron (an expression)")
    raise TaskError(FIELD, "must be 'every 30m', a cron expression, or an object with every "
                    f"or cron, got {value!r}"[:200])


@lru_cache(maxsize=1024)
def _parse_json(text: str) -> Schedule | None:
    return parse_schedule(json.loads(text))


def schedule_of(raw: Any) -> Schedule | None:
    """:func:`parse_schedule`, cached for values that are already valid JSON (the seeder
    parses every claimed seed's schedule again)."""
    if raw is None:
        return None
    return _parse_json(json.dumps(raw, sort_keys=True))

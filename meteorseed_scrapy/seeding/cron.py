"""Standard 5-field cron expressions, parsed here (no dependency), and their next fire time.

``minute hour day-of-month month day-of-week``: ``*``, numbers, ranges ``a-b``, steps ``*/n``,
``a-b/n`` and ``a/n`` (from a to the field's end), lists ``a,b-c``, month names ``jan``-``dec``
and day names ``sun``-``sat`` (case-insensitive; day 7 is Sunday too), and the macros
``@yearly`` ``@annually`` ``@monthly`` ``@weekly`` ``@daily`` ``@midnight`` ``@hourly``.

Day-of-month and day-of-week follow Vixie cron's rule (and cronsim's, which the tests check
against): when neither field starts with ``*`` a day matches if *either* matches; otherwise
it must match *both* (so ``*/2`` in day-of-month is every other day, not every day).
Times are wall-clock times in the expression's zone (UTC by default). A wall time skipped by a
DST change fires once right after the change (the offset before it applies); a wall time that
occurs twice fires once, at its first occurrence.
"""

from __future__ import annotations

import calendar
import datetime as dt
from bisect import bisect_left
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from meteorseed_scrapy.task.validation import TaskError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {name: i for i, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)}
_DAYS = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: (name, lowest, highest, names) of the five fields, in order.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)
#: Years searched ahead for the next fire time (Feb 29 on a given weekday recurs within 28).
_SEARCH_YEARS = 30
_UTC = dt.timezone.utc


def _value(text: str, where: str, low: int, high: int, names: dict[str, int]) -> int:
    key = text.lower()
    if key in names:
        return names[key]
    if not text.isdigit():
        raise TaskError(where, f"{text!r} is not a number{' or a name' if names else ''}")
    value = int(text)
    if not low <= value <= high:
        raise TaskError(where, f"{value} is out of range {low}-{high}")
    return value


def _parse_field(text: str, where: str, low: int, high: int,
                 names: dict[str, int]) -> tuple[int, ...]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise TaskError(where, f"empty element in {text!r}")
        span, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise TaskError(where, f"step {step_text!r} must be a positive integer")
            step = int(step_text)
        if span == "*":
            first, last = low, high
        elif "-" in span:
            a, _, b = span.partition("-")
            first, last = (_value(a, where, low, high, names), _value(b, where, low, high, names))
            if first > last:
                raise TaskError(where, f"range {span!r} runs backwards")
        else:
            first = _value(span, where, low, high, names)
            last = high if slash else first  # "a/n": from a to the end, as Vixie cron reads it
        values.update(range(first, last + 1, step))
    return tuple(sorted(values))


@dataclass(frozen=True)
class CronExpr:
    """A parsed cron expression; :meth:`next_after` gives its next fire time."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    day_star: bool  # day-of-month field starts with "*" ("*" or "*/n": Vixie's test)
    weekday_star: bool

    @classmethod
    def parse(cls, text: str, field: str = "schedule.cron") -> CronExpr:
        """Parse ``text``; raises :class:`TaskError` naming ``field`` and the cron field."""
        if not isinstance(text, str) or not text.strip():
            raise TaskError(field, "must be a cron expression such as '*/15 * * * *'")
        expr = MACROS.get(text.strip().lower(), text) if text.strip().startswith("@") else text
        if expr.strip().startswith("@"):
            raise TaskError(field, f"unknown macro {text.strip()!r}; use one of "
                            + ", ".join(MACROS))
        parts = expr.split()
        if len(parts) != 5:
            raise TaskError(field, f"needs 5 fields (minute hour day-of-month month "
                            f"day-of-week), got {len(parts)} in {text!r}")
        fields = [_parse_field(p, f"{field} ({name})", low, high, names)
                  for p, (name, low, high, names) in zip(parts, _FIELDS, strict=True)]
        cron = cls(
            text=text.strip(), minutes=fields[0], hours=fields[1], days=frozenset(fields[2]),
            months=frozenset(fields[3]), weekdays=frozenset(d % 7 for d in fields[4]),
            day_star=parts[2].startswith("*"), weekday_star=parts[4].startswith("*"),
        )
        if cron.weekday_star and not any(
            day <= calendar.monthrange(2000, month)[1]  # 2000: a leap year, Feb has 29
            for month in cron.months for day in cron.days
        ):
            raise TaskError(field, f"{text!r} never fires (no such day in those months)")
        return cron

    def _day_matches(self, day: dt.date) -> bool:
        in_month = day.day in self.days
        in_week = (day.weekday() + 1) % 7 in self.weekdays
        if self.day_star or self.weekday_star:
            # (a "*/n" field is a restriction too: both must hold, as in Vixie cron)
            return in_month and in_week
        return in_month or in_week  # both restricted: either (Vixie cron)

    def next_after(self, after: float, tz: ZoneInfo | None = None) -> float:
        """The first fire time strictly after ``after`` (epoch seconds), as epoch seconds."""
        zone: dt.tzinfo = tz or _UTC
        start = dt.datetime.fromtimestamp(after, zone).replace(tzinfo=None, second=0,
                                                               microsecond=0)
        t = start + dt.timedelta(minutes=1)
        limit = t.year + _SEARCH_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
                t = dt.datetime(year, month, 1)
                continue
            if not self._day_matches(t.date()):
                t = dt.datetime.combine(t.date() + dt.timedelta(days=1), dt.time())
                continue
            i = bisect_left(self.hours, t.hour)
            if i == len(self.hours):
                t = dt.datetime.combine(t.date() + dt.timedelta(days=1), dt.time())
                continue
            if self.hours[i] != t.hour:
                t = t.replace(hour=self.hours[i], minute=0)
            j = bisect_left(self.minutes, t.minute)
            if j == len(self.minutes):
                t = t.replace(minute=0) + dt.timedelta(hours=1)
                continue
            t = t.replace(minute=self.minutes[j])
            # fold=0: the first of a repeated wall time; a skipped one maps past the gap.
            fire = t.replace(tzinfo=zone, fold=0).timestamp()
            if fire > after:
                return fire
            t += dt.timedelta(minutes=1)
        raise ValueError(f"cron {self.text!r} does not fire within {_SEARCH_YEARS} years")

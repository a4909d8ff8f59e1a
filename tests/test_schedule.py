"""Schedules: ``every`` intervals, the cron parser and its next fire times (checked against
cronsim), time zones and DST, and the adaptive interval rule."""

from __future__ import annotations

import calendar
import datetime as dt
import itertools
from importlib.metadata import version
from typing import Any

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version

from meteorseed_scrapy.seeding.adapt import (
    Bounds,
    RunState,
    effective_bounds,
    plan_next,
    site_bounds,
)
from meteorseed_scrapy.seeding.cron import CronExpr
from meteorseed_scrapy.seeding.schedule import Cron, Every, parse_interval, parse_schedule
from meteorseed_scrapy.seeding.seed_lines import SeedLineError, parse_seed_line
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.validators import format_duration

UTC = dt.timezone.utc


def ts(*args: int) -> float:
    year, month, day, hour, minute = (*args, 0, 0)[:5]
    return dt.datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


def at(value: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(value, UTC)


def nxt(expr: str, *start: int, tz: str | None = None) -> dt.datetime:
    schedule = parse_schedule({"cron": expr, "tz": tz} if tz else expr)
    assert isinstance(schedule, Cron)
    return at(schedule.next_after(ts(*start)))


# -- every ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "seconds"), [
    ("every 30m", 1800), ("EVERY 2h", 7200), ("every 45s", 45), ("every 1d", 86400),
    ("every 1.5h", 5400), ({"every": "10m"}, 600), ({"every": 90}, 90), ({"every": 2.5}, 2.5),
    # the one duration grammar (validators.parse_duration): weeks, parts, plain seconds as text
    ("every 2w", 1_209_600), ("every 1h30m", 5400), ({"every": "90"}, 90),
    ({"every": "1d 12h"}, 129_600),
])
def test_every_forms(value: Any, seconds: float) -> None:
    schedule = parse_schedule(value)
    assert isinstance(schedule, Every) and schedule.seconds == seconds and schedule.adaptive


def test_every_object_options() -> None:
    schedule = parse_schedule({"every": "30m", "min": "5m", "max": "3h", "target": 4,
                               "adaptive": False})
    assert schedule == Every(1800, 300, 10800, 4.0, False)
    assert schedule.describe() == "every 30m (fixed)"


@pytest.mark.parametrize(("value", "field"), [
    ("every 3 weeks", "schedule.every"), ("every 0s", "schedule.every"),
    ("every nan", "schedule.every"), ({"every": float("nan")}, "schedule.every"),
    ({"every": float("inf")}, "schedule.every"), ({"every": "1e400"}, "schedule.every"),
    ({"every": "-1h"}, "schedule.every"), ({"every": "30m1h"}, "schedule.every"),
    ({"every": ""}, "schedule.every"), ({"every": "1h", "max": "2W"}, "schedule.max"),
    ({"every": "10x"}, "schedule.every"), ({"every": True}, "schedule.every"),
    ({"every": -5}, "schedule.every"), ({"every": "400d"}, "schedule.every"),
    ({"every": "1h", "min": "2h", "max": "1h"}, "schedule.min"),
    ({"every": "1h", "target": 0}, "schedule.target"),
    ({"every": "1h", "adaptive": "yes"}, "schedule.adaptive"),
    ({"every": "1h", "cron": "* * * * *"}, "schedule"), ({"evry": "1h"}, "schedule"),
    ({"every": "1h", "tz": "UTC"}, "schedule.tz"),
    ({"cron": "@daily", "min": "1h"}, "schedule.min"),
    ({"cron": "@daily", "tz": "Mars/Olympus"}, "schedule.tz"), (42, "schedule"), ([], "schedule"),
])
def test_bad_schedules_name_the_field(value: Any, field: str) -> None:
    with pytest.raises(TaskError) as info:
        parse_schedule(value)
    assert info.value.field == field


def test_parse_seed_line_validates_the_schedule() -> None:
    line = ('{"seed_id": "s", "site_id": "x", "task_type": "url_list", '
            '"payload": {"urls": ["https://a.example/"]}, "schedule": "every soon"}')
    with pytest.raises(SeedLineError) as info:
        parse_seed_line(line, 3)
    assert info.value.lineno == 3 and info.value.reason.startswith("schedule.every:")
    good = parse_seed_line(line.replace("every soon", "*/5 * * * *"), 1)
    assert good.schedule == "*/5 * * * *"


def test_durations() -> None:
    assert parse_interval("2h", "f") == 7200
    assert parse_interval(format_duration(90061), "f") == 90061
    with pytest.raises(TaskError) as info:
        parse_interval("53w", "schedule.max")  # the grammar's, but beyond 366 days
    assert info.value.field == "schedule.max"
    assert [format_duration(s) for s in (5400, 600, 45, 90061, 0)] == [
        "1h30m", "10m", "45s", "1d1h1m1s", "0s"]


# -- cron: parsing -------------------------------------------------------------------------------

def test_cron_fields() -> None:
    cron = CronExpr.parse("*/15 9-17/4 1,15 1 *")
    assert cron.minutes == (0, 15, 30, 45) and cron.hours == (9, 13, 17)
    assert cron.days == {1, 15} and cron.months == {1}
    named = CronExpr.parse("0 0 * JAN-mar,Dec Mon-FRI")
    assert named.months == {1, 2, 3, 12} and named.weekdays == {1, 2, 3, 4, 5}
    assert CronExpr.parse("0 0 * * 7").weekdays == {0}  # 7 is Sunday too
    assert CronExpr.parse("5/20 * * * *").minutes == (5, 25, 45)  # a/n: a to the end
    assert CronExpr.parse("@hourly").minutes == (0,)
    assert CronExpr.parse("@DAILY").hours == (0,)


@pytest.mark.parametrize(("expr", "where"), [
    ("* * * *", "schedule"), ("* * * * * *", "schedule"), ("60 * * * *", "minute"),
    ("* 24 * * *", "hour"), ("* * 0 * *", "day-of-month"), ("* * * 13 *", "month"),
    ("* * * * 8", "day-of-week"), ("*/0 * * * *", "minute"), ("*/x * * * *", "minute"),
    ("5-1 * * * *", "minute"), ("1,,2 * * * *", "minute"), ("* * * foo *", "month"),
    ("* * * * funday", "day-of-week"), ("@fortnightly", "schedule"), ("", "schedule"),
    ("0 0 30 2 *", "schedule"), ("0 0 31 4,6,9,11 *", "schedule"), ("-1 * * * *", "minute"),
])
def test_cron_errors(expr: str, where: str) -> None:
    with pytest.raises(TaskError) as info:
        parse_schedule(expr)
    assert info.value.field.startswith("schedule")
    assert where in info.value.field


# -- cron: next fire times -----------------------------------------------------------------------

def test_cron_next_basics() -> None:
    assert nxt("*/15 * * * *", 2026, 1, 5, 10, 7) == dt.datetime(2026, 1, 5, 10, 15, tzinfo=UTC)
    # strictly after: at a fire time, the next one
    assert nxt("*/15 * * * *", 2026, 1, 5, 10, 15) == dt.datetime(2026, 1, 5, 10, 30, tzinfo=UTC)
    assert nxt("@hourly", 2026, 12, 31, 23, 30) == dt.datetime(2027, 1, 1, 0, 0, tzinfo=UTC)
    assert nxt("@daily", 2026, 1, 5, 0, 0) == dt.datetime(2026, 1, 6, tzinfo=UTC)
    assert nxt("@weekly", 2026, 11, 30) == dt.datetime(2026, 12, 6, tzinfo=UTC)  # a Sunday
    assert nxt("@yearly", 2026, 6, 1) == dt.datetime(2027, 1, 1, tzinfo=UTC)
    assert nxt("0 9 * * mon-fri", 2026, 11, 27, 10) == dt.datetime(2026, 11, 30, 9, tzinfo=UTC)


def test_cron_month_ends_and_leap_years() -> None:
    assert nxt("0 0 31 * *", 2026, 1, 31, 0, 0) == dt.datetime(2026, 3, 31, tzinfo=UTC)
    assert nxt("0 0 31 * *", 2026, 4, 1) == dt.datetime(2026, 5, 31, tzinfo=UTC)
    assert nxt("0 0 29 2 *", 2025, 3, 1) == dt.datetime(2028, 2, 29, tzinfo=UTC)
    assert nxt("0 0 29 2 *", 2096, 3, 1) == dt.datetime(2104, 2, 29, tzinfo=UTC)  # 2100: no
    assert nxt("0 0 28-31 2 *", 2027, 2, 28, 12) == dt.datetime(2028, 2, 28, tzinfo=UTC)
    assert nxt("59 23 30 * *", 2026, 2, 1) == dt.datetime(2026, 3, 30, 23, 59, tzinfo=UTC)


def test_cron_day_of_month_or_day_of_week() -> None:
    # both restricted: the 13th OR a Friday (Vixie cron)
    assert nxt("0 0 13 * fri", 2026, 11, 30) == dt.datetime(2026, 12, 4, tzinfo=UTC)
    assert nxt("0 0 13 * fri", 2026, 12, 5) == dt.datetime(2026, 12, 11, tzinfo=UTC)
    assert nxt("0 0 1 * mon", 2026, 12, 29) == dt.datetime(2027, 1, 1, tzinfo=UTC)  # a Friday
    # a field starting with * ("*" or "*/n"): both must hold (odd days that are Mondays)
    assert nxt("0 0 */2 * mon", 2026, 12, 8) == dt.datetime(2026, 12, 21, tzinfo=UTC)
    assert nxt("0 0 13 * *", 2026, 11, 30) == dt.datetime(2026, 12, 13, tzinfo=UTC)
    assert nxt("0 0 * * sun", 2026, 11, 30) == dt.datetime(2026, 12, 6, tzinfo=UTC)


def test_cron_time_zones_and_dst() -> None:
    berlin = "Europe/Berlin"
    assert nxt("0 9 * * *", 2026, 1, 10, tz=berlin) == dt.datetime(2026, 1, 10, 8, tzinfo=UTC)
    assert nxt("0 9 * * *", 2026, 7, 10, tz=berlin) == dt.datetime(2026, 7, 10, 7, tzinfo=UTC)
    # 2026-03-29 02:30 does not exist in Berlin: it fires once, right after the jump
    assert nxt("30 2 * * *", 2026, 3, 29, 0, 0, tz=berlin) == dt.datetime(
        2026, 3, 29, 1, 30, tzinfo=UTC)
    assert nxt("30 2 * * *", 2026, 3, 29, 1, 30, tz=berlin) == dt.datetime(
        2026, 3, 30, 0, 30, tzinfo=UTC)
    # 2026-10-25 02:30 happens twice: fires at the first one only
    first = nxt("30 2 * * *", 2026, 10, 24, 23, 0, tz=berlin)
    assert first == dt.datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    assert nxt("30 2 * * *", 2026, 10, 25, 0, 30, tz=berlin) == dt.datetime(
        2026, 10, 26, 1, 30, tzinfo=UTC)
    # an hourly job in a repeated hour still fires once per wall-clock hour, never backwards
    times = [ts(2026, 10, 24, 23, 50)]
    schedule = parse_schedule({"cron": "0 * * * *", "tz": berlin})
    assert isinstance(schedule, Cron)
    for _ in range(5):
        times.append(schedule.next_after(times[-1]))
    assert all(b > a for a, b in itertools.pairwise(times))


# -- cron against cronsim (the oracle: a kept library, Vixie's day rule) ----------------------

_FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


@st.composite
def _cron_field(draw: st.DrawFn, index: int) -> str:
    """One field in this parser's grammar: ``*``, ``*/n``, ``a``, ``a-b``, ``a-b/n``, ``a/n``,
    lists of them; steps up to twice the field's span (a step larger than the range)."""
    low, high = _FIELD_RANGES[index]

    def element() -> str:
        kind = draw(st.integers(0, 5))
        step = draw(st.integers(1, 2 * (high - low) + 2))
        a = draw(st.integers(low, high))
        b = draw(st.integers(a, high))
        return ("*", f"*/{step}", str(a), f"{a}-{b}", f"{a}-{b}/{step}", f"{a}/{step}")[kind]

    first = element()
    if first.startswith("*"):
        return first
    return ",".join([first] + [element() for _ in range(draw(st.integers(0, 2)))])


_CRON = st.tuples(*(_cron_field(i) for i in range(5))).map(" ".join)
#: Day fields drawn often as the cases that went wrong: */n in DOM or DOW, both restricted.
_DAY_CASES = st.tuples(
    st.sampled_from(["0", "30", "*/5", "15"]), st.sampled_from(["0", "*/3", "12"]),
    st.sampled_from(["*", "*/2", "*/3", "13", "1-7", "29", "30", "31", "*/40", "5/10"]),
    st.sampled_from(["*", "2", "*/2", "4,6,9,11", "1-3"]),
    st.sampled_from(["*", "*/2", "5", "1-5", "0", "7", "*/10", "6/2"]),
).map(" ".join)
_STARTS = st.integers(0, 10 * 365 * 1440).map(
    lambda minutes: dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(minutes=minutes))


#: cronsim 2.7, the newest for Python 3.10, is no oracle for two of the cases: it reads
#: ``a-a/n`` as ``a/n`` (from ``a`` to the field's end) and refuses a day-of-month over 29
#: that no month of the month field has even when a day-of-week is given (2.8 fixed both).
_ORACLE = Version(version("cronsim")) >= Version("2.8")
needs_oracle = pytest.mark.skipif(
    not _ORACLE, reason=f"cronsim {version('cronsim')} < 2.8: two known bugs (see _ORACLE)")


def _agrees_with_cronsim(expr: str, start: dt.datetime) -> None:
    try:
        cron = CronExpr.parse(expr)
    except TaskError:
        with pytest.raises(CronSimError):  # refused here: cronsim refuses it too
            next(CronSim(expr, start))
        return
    oracle = CronSim(expr, start)
    t = start.timestamp()
    for _ in range(4):
        t = cron.next_after(t)
        assert at(t) == next(oracle), expr


@needs_oracle
@settings(max_examples=3000, deadline=None, derandomize=True)
@given(_CRON, _STARTS)
def test_cron_agrees_with_cronsim(expr: str, start: dt.datetime) -> None:
    _agrees_with_cronsim(expr, start)


@needs_oracle
@settings(max_examples=1000, deadline=None, derandomize=True)
@given(_DAY_CASES, _STARTS)
def test_cron_day_rules_agree_with_cronsim(expr: str, start: dt.datetime) -> None:
    _agrees_with_cronsim(expr, start)


@pytest.mark.parametrize(("expr", "start", "fires"), [
    # */2 in day-of-month: every other day (1st, 3rd, ...), not every day
    ("0 0 */2 * *", (2026, 1, 1, 1), [(2026, 1, 3), (2026, 1, 5), (2026, 1, 7)]),
    # */2 in day-of-week: Sun, Tue, Thu, Sat
    ("0 0 * * */2", (2026, 1, 1, 1), [(2026, 1, 3), (2026, 1, 4), (2026, 1, 6)]),
    # "*/2" counts as starting with "*": both fields must hold (odd days that are Mondays)
    ("0 0 */2 * mon", (2026, 11, 30, 1), [(2026, 12, 7), (2026, 12, 21), (2027, 1, 11)]),
    # both restricted: either (the 13th or a Friday)
    ("0 0 13 * fri", (2026, 11, 30), [(2026, 12, 4), (2026, 12, 11), (2026, 12, 13)]),
    # a step larger than the range: its first value only
    ("0 0 */40 * *", (2026, 1, 1, 1), [(2026, 2, 1), (2026, 3, 1), (2026, 4, 1)]),
    # Feb 30 with a weekday: never the 30th, only the Mondays of February
    ("0 0 30 2 mon", (2026, 1, 1), [(2026, 2, 2), (2026, 2, 9), (2026, 2, 16)]),
])
def test_cron_named_day_cases(expr: str, start: tuple[int, ...],
                              fires: list[tuple[int, ...]]) -> None:
    t = ts(*start)
    for expected in fires:
        t = CronExpr.parse(expr).next_after(t)
        assert at(t) == at(ts(*expected)), expr
    if _ORACLE:  # (the expectations above are this test's own: they run on every cronsim)
        _agrees_with_cronsim(expr, at(ts(*start)))


@pytest.mark.parametrize(("expr", "field"), [
    ("0 0 30 2 *", "schedule"), ("0 0 30 2 */2", "schedule"), ("0 0 32 * *", "day-of-month"),
    ("0 0 * * 8", "day-of-week"), ("0 0 */0 * *", "day-of-month"), ("0 0 * 2-1 *", "month"),
    ("0 0 * * */x", "day-of-week"), ("0 60/2 * * *", "hour"), ("0 0 1-40 * *", "day-of-month"),
])
def test_cron_invalid_fields_are_named(expr: str, field: str) -> None:
    with pytest.raises(TaskError) as info:
        CronExpr.parse(expr)
    assert field in info.value.field
    with pytest.raises(CronSimError):
        next(CronSim(expr, dt.datetime(2026, 1, 1)))


def test_leap_day_table() -> None:
    leap = [y for y in range(2000, 2101) if calendar.isleap(y)]
    cron = CronExpr.parse("0 12 29 feb *")
    found, t = [], ts(1999, 12, 31)
    for _ in range(len(leap)):
        t = cron.next_after(t)
        found.append(at(t).year)
    assert found == leap


# -- adaptive interval ---------------------------------------------------------------------------

def _runs(every: Every, bounds: Bounds, yields: list[int]) -> list[float]:
    state, now, out = RunState(), 0.0, []
    for new_urls in yields:
        plan = plan_next(every, bounds, state, now=now, started_at=now, ok=True,
                         new_urls=new_urls)
        assert plan.interval_s is not None and plan.next_due == now + plan.interval_s
        out.append(plan.interval_s)
        state = RunState(plan.interval_s, plan.rate, now, 0)
        now = plan.next_due
    return out


def test_adaptive_interval_moves_both_ways_within_bounds() -> None:
    every, bounds = Every(1800), Bounds(600, 7200)
    busy = _runs(every, bounds, [200] * 6)  # many new items: down to the min, smoothly
    assert busy[:3] == [900, 600, 600] and min(busy) == 600
    quiet = _runs(every, bounds, [0] * 6)  # nothing new: up to the max, doubling
    assert quiet[:3] == [3600, 7200, 7200] and max(quiet) == 7200
    # after a busy spell the mean yield decays (halving per run) before the interval grows
    both = _runs(every, bounds, [200] * 4 + [0] * 12 + [500] * 6)
    assert both[3] == 600 and both[4] == 600 and max(both[4:16]) == 7200 and both[-1] == 600
    assert all(600 <= s <= 7200 for s in both)
    steps = [b / a for a, b in itertools.pairwise(both)]
    assert all(0.5 <= r <= 2 for r in steps)  # never more than x2 or /2 per run


def test_adaptive_interval_settles_where_target_yield_is_found() -> None:
    # 60 new URLs per hour, target 10 per run: settles at 10 minutes' worth (600 s)
    rates = []
    every, bounds = Every(3600, target=10), Bounds(60, 7200)
    state, now = RunState(), 0.0
    for _ in range(12):
        interval = state.interval_s or every.seconds
        plan = plan_next(every, bounds, state, now=now, started_at=now, ok=True,
                         new_urls=round(60 * interval / 3600))
        assert plan.interval_s is not None
        rates.append(plan.interval_s)
        state = RunState(plan.interval_s, plan.rate, now, 0)
        now += plan.interval_s
    assert abs(rates[-1] - 600) < 1


def test_fixed_and_cron_schedules_do_not_adapt() -> None:
    fixed = _runs(Every(1800, adaptive=False), Bounds(), [0, 500, 0])
    assert fixed == [1800, 1800, 1800]
    cron = parse_schedule("0 * * * *")
    plan = plan_next(cron, Bounds(), RunState(), now=ts(2026, 1, 1, 10, 20),
                     started_at=ts(2026, 1, 1, 10, 0), ok=False, new_urls=0)
    assert plan.next_due == ts(2026, 1, 1, 11, 0) and plan.interval_s is None


def test_failures_back_off_and_one_shot_retries_end() -> None:
    every, bounds = Every(600), Bounds(600, 7200)
    waits = [plan_next(every, bounds, RunState(600, None, None, f), now=0, started_at=0,
                       ok=False, new_urls=0).next_due for f in range(8)]
    assert waits[:4] == [1200, 2400, 4800, 9600] and max(w or 0 for w in waits) == 4 * 7200
    retry = plan_next(None, bounds, RunState(failures=0), now=0, started_at=0, ok=False,
                      new_urls=0)
    assert retry.next_due == 1200
    given_up = plan_next(None, bounds, RunState(failures=5), now=0, started_at=0, ok=False,
                         new_urls=0)
    assert given_up.next_due is None


def test_bounds_from_schedule_site_and_settings() -> None:
    defaults = Bounds(600, 7200)
    assert effective_bounds(Every(1800), defaults) == Bounds(600, 7200)
    assert effective_bounds(Every(86400), defaults) == Bounds(600, 86400)  # every widens max
    assert effective_bounds(Every(60), defaults) == Bounds(60, 7200)
    assert effective_bounds(Every(1800, 300, 900), defaults) == Bounds(300, 900)
    assert site_bounds({"every": "6h", "min": "5m", "max": "1h"}, defaults, "s") == Bounds(
        300, 3600)
    assert site_bounds({"min_interval": 120}, defaults, "s") == Bounds(120, 7200)
    assert site_bounds({"min": "soon"}, defaults, "s") == defaults  # logged, ignored
    assert site_bounds({"min": "3h", "max": "1h"}, defaults, "s") == defaults
    assert site_bounds(None, defaults, "s") == defaults

"""When a seed runs next: the adaptive interval of ``every`` schedules, cron fire times, and
the back-off of failing seeds. Pure functions of a seed's state (no I/O), so the rule is tested
directly; :class:`~meteorseed_scrapy.seeding.registry.SeedRegistry` applies it in
``record_run``.

The rule (docs/seeding.md): ``rate`` is an exponentially weighted mean (weight
:data:`EWMA_WEIGHT` on the newest run) of new URLs per hour, measured over the time since the
previous run (at least the interval in use). The ideal interval is ``target / rate`` (the
time in which ``target`` new URLs appear); the next interval moves towards it by at most a
factor :data:`MAX_STEP` per run (smooth), and stays within the bounds. No yield at all (rate
0) doubles the interval up to the max; a flood halves it down to the min.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meteorseed_scrapy.backoff import exponential
from meteorseed_scrapy.seeding.schedule import Cron, Every, Schedule, parse_interval
from meteorseed_scrapy.settings import DEFAULTS

logger = logging.getLogger(__name__)

#: Settings (and their defaults, seconds) bounding adaptive intervals when neither the schedule
#: nor the site's rule config (``schedule: {min: 10m, max: 2h}``) says.
MIN_INTERVAL_SETTING = "METEORSEED_SCHEDULE_MIN_INTERVAL"
MAX_INTERVAL_SETTING = "METEORSEED_SCHEDULE_MAX_INTERVAL"
DEFAULT_MIN_INTERVAL = float(DEFAULTS[MIN_INTERVAL_SETTING])
DEFAULT_MAX_INTERVAL = float(DEFAULTS[MAX_INTERVAL_SETTING])
#: Weight of the newest run in the yield-rate mean.
EWMA_WEIGHT = 0.5
#: Most an interval may grow or shrink in one run (x2 or /2).
MAX_STEP = 2.0
#: A failing seed waits interval * 2^failures, at most this many times its max bound.
FAILURE_CAP_FACTOR = 4.0
#: A seed without a schedule is retried this many times after failures, then left alone.
ONE_SHOT_RETRIES = 5


@dataclass(frozen=True)
class Bounds:
    """Where an adaptive interval may go, seconds."""

    min_s: float = DEFAULT_MIN_INTERVAL
    max_s: float = DEFAULT_MAX_INTERVAL

    def __post_init__(self) -> None:
        if not 0 < self.min_s <= self.max_s:
            raise ValueError(f"schedule bounds: need 0 < min <= max, got {self.min_s} and "
                             f"{self.max_s}")

    def clamp(self, seconds: float) -> float:
        return min(self.max_s, max(self.min_s, seconds))


def site_bounds(schedule: Mapping[str, Any] | None, defaults: Bounds, site_id: str) -> Bounds:
    """The bounds a site's rule config gives in ``schedule: {min: ..., max: ...}`` (also
    ``min_interval`` / ``max_interval``), over ``defaults``. Read defensively: the site schema
    keeps ``schedule`` as a free mapping, so a bad value is logged and ignored."""
    if not schedule:
        return defaults
    low, high = defaults.min_s, defaults.max_s
    for names, which in ((("min", "min_interval"), "min"), (("max", "max_interval"), "max")):
        for name in names:
            if name not in schedule:
                continue
            try:
                value = parse_interval(schedule[name], f"schedule.{name}")
            except ValueError as exc:
                logger.warning("site %s: ignoring its schedule bound (%s)", site_id, exc)
                continue
            low, high = (value, high) if which == "min" else (low, value)
    if low > high:
        logger.warning("site %s: schedule min %s s is above max %s s; using the defaults",
                       site_id, low, high)
        return defaults
    return Bounds(low, high)


def effective_bounds(every: Every, site: Bounds) -> Bounds:
    """The schedule's own ``min``/``max`` win; else the site's, widened to include ``every``
    (a seed asked to run every day is never run every 2 h because of a default bound)."""
    low = every.min_s if every.min_s is not None else min(site.min_s, every.seconds)
    high = every.max_s if every.max_s is not None else max(site.max_s, every.seconds)
    return Bounds(low, max(low, high))


@dataclass(frozen=True)
class RunState:
    """What the registry knows of a seed before this run's outcome is written."""

    interval_s: float | None = None  # the interval in use (None: never run under this schedule)
    rate: float | None = None  # EWMA of new URLs per hour
    previous_run: float | None = None  # start of the run before this one
    failures: int = 0  # consecutive failures before this run


@dataclass(frozen=True)
class Plan:
    """What to write after a run: the next due time (None: not scheduled any more)."""

    next_due: float | None
    interval_s: float | None
    rate: float | None


def adapt(every: Every, bounds: Bounds, state: RunState, *, started_at: float,
          new_urls: int) -> tuple[float, float | None]:
    """``(next interval, new rate)`` after a successful run that found ``new_urls``."""
    current = bounds.clamp(state.interval_s if state.interval_s is not None else every.seconds)
    if not every.adaptive:
        return every.seconds, state.rate
    # Since the previous run, but at least the interval in use: a run brought forward (an
    # edit makes a seed due at once) must not read as a burst of yield.
    elapsed = current if state.previous_run is None else max(
        current, started_at - state.previous_run)
    observed = max(0, new_urls) * 3600.0 / max(elapsed, 1.0)
    rate = observed if state.rate is None else (
        EWMA_WEIGHT * observed + (1 - EWMA_WEIGHT) * state.rate)
    ideal = math.inf if rate <= 0 else every.target * 3600.0 / rate
    step = min(current * MAX_STEP, max(current / MAX_STEP, ideal))
    return bounds.clamp(step), rate


def plan_next(schedule: Schedule | None, site: Bounds, state: RunState, *, now: float,
              started_at: float, ok: bool, new_urls: int) -> Plan:
    """The next due time of a seed whose run started at ``started_at`` just ended at ``now``."""
    if isinstance(schedule, Cron):
        # A cron schedule is a promise about wall-clock times: kept, failing or not.
        return Plan(schedule.next_after(now), None, state.rate)
    if schedule is None:
        if ok or state.failures + 1 > ONE_SHOT_RETRIES:
            return Plan(None, None, state.rate)
        return Plan(now + _backoff(site.min_s, state.failures + 1, site.max_s), None, state.rate)
    bounds = effective_bounds(schedule, site)
    if not ok:
        current = bounds.clamp(state.interval_s or schedule.seconds)
        return Plan(now + _backoff(current, state.failures + 1, bounds.max_s), current,
                    state.rate)
    interval, rate = adapt(schedule, bounds, state, started_at=started_at, new_urls=new_urls)
    return Plan(now + interval, interval, rate)


def _backoff(interval: float, failures: int, max_s: float) -> float:
    return exponential(failures, interval, max(interval, max_s * FAILURE_CAP_FACTOR))


BoundsFor = Callable[[str], Bounds]

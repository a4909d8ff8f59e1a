"""Circuit breaker per site: this worker's sliding window plus the fleet's, judged in Redis.

The breaker opens for the whole fleet only when this worker's window and the fleet's are both
abnormal (error ratio or mean latency), so one worker's bad network cannot trip a healthy
site. While open, the gate lets one probe through per ``METEORSEED_BREAKER_PROBE_INTERVAL``
(a Redis lock); a good probe starts a ramp (1 %, 5 %, 25 %, 50 % of the rate, then closed).

It also keeps the fleet's clock of a site's continuous trouble (breaker open, window abnormal,
or throttling) in Redis: after ``give_up`` seconds of it, the site's waiting tasks are
dead-lettered (:meth:`Breaker.given_up`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.politeness.site_errors import SITE_ERRORS, SiteFaults
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.settings import DEFAULTS, duration_setting, integer_setting, number_setting

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis
    from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
    from meteorseed_scrapy.settings import SettingsSource

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
MIN_FAILING_TASKS = 3  # distinct tasks failing in this worker's window before it judges the site


class _Window:
    """This worker's recent downloads of one site, oldest first: (monotonic time, error,
    latency s, task id), and how many of them failed (kept as they come and go, so a healthy
    site is judged without going through its whole window)."""

    __slots__ = ("entries", "errors")

    def __init__(self) -> None:
        self.entries: deque[tuple[float, bool, float, str]] = deque()
        self.errors = 0

    def add(self, now: float, error: bool, latency_s: float, task_id: str) -> None:
        self.entries.append((now, error, latency_s, task_id))
        self.errors += error

    def prune(self, horizon: float) -> None:
        entries = self.entries
        while entries and entries[0][0] < horizon:
            self.errors -= entries.popleft()[1]


class BreakerState(str, Enum):
    """A site's circuit breaker, as ``lua/health.lua`` keeps it."""

    CLOSED = "closed"
    OPEN = "open"
    RAMP = "ramp"  # recovering: the rate grows back step by step (half-open)

@dataclass(frozen=True)
class BreakerConfig:
    window: float = DEFAULTS["METEORSEED_BREAKER_WINDOW"]
    min_requests: int = DEFAULTS["METEORSEED_BREAKER_MIN_REQUESTS"]
    error_ratio: float = DEFAULTS["METEORSEED_BREAKER_ERROR_RATIO"]
    max_latency: float = DEFAULTS["METEORSEED_BREAKER_MAX_LATENCY"]  # mean s that is abnormal
    probe_interval: float = DEFAULTS["METEORSEED_BREAKER_PROBE_INTERVAL"]
    #: open longer than this: tasks below ``degrade_below`` priority are parked for
    #: ``degrade_delay`` instead of coming back at every probe (degrade by priority)
    degrade_after: float = DEFAULTS["METEORSEED_BREAKER_DEGRADE_AFTER"]
    degrade_delay: float = DEFAULTS["METEORSEED_BREAKER_DEGRADE_DELAY"]
    degrade_below: int = DEFAULTS["METEORSEED_BREAKER_DEGRADE_BELOW"]
    #: seconds of continuous trouble at a site before its waiting tasks are dead-lettered
    give_up: float = DEFAULTS["METEORSEED_GIVE_UP_AFTER"]
    #: trouble not seen again within this is over (longer than the longest pause)
    trouble_memory: float = 3 * DEFAULTS["METEORSEED_BACKOFF_MAX"]

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> BreakerConfig:
        give_up = duration_setting(settings, "METEORSEED_GIVE_UP_AFTER", positive=True)
        batch = duration_setting(settings, "METEORSEED_BATCH_GIVE_UP_AFTER", positive=True)
        if duration_setting(settings, "METEORSEED_IDLE_CLOSE") > 0:
            give_up = min(give_up, batch)  # a batch crawl must end
        return cls(
            window=duration_setting(settings, "METEORSEED_BREAKER_WINDOW", positive=True),
            min_requests=integer_setting(settings, "METEORSEED_BREAKER_MIN_REQUESTS", minimum=1),
            error_ratio=number_setting(settings, "METEORSEED_BREAKER_ERROR_RATIO", positive=True,
                                       maximum=1),
            max_latency=duration_setting(settings, "METEORSEED_BREAKER_MAX_LATENCY",
                                         positive=True),
            probe_interval=duration_setting(settings, "METEORSEED_BREAKER_PROBE_INTERVAL",
                                            positive=True),
            degrade_after=duration_setting(settings, "METEORSEED_BREAKER_DEGRADE_AFTER",
                                           positive=True),
            degrade_delay=duration_setting(settings, "METEORSEED_BREAKER_DEGRADE_DELAY",
                                           positive=True),
            # a priority: any whole number
            degrade_below=integer_setting(settings, "METEORSEED_BREAKER_DEGRADE_BELOW",
                                          minimum=float("-inf")),
            give_up=give_up,
            trouble_memory=max(900.0, 3 * duration_setting(settings, "METEORSEED_BACKOFF_MAX",
                                                           positive=True)),
        )

    @property
    def ramp_step_s(self) -> float:
        # Each ramp step lasts long enough to judge it, but a recovered site is back at full
        # rate within about one window.
        return max(1.0, self.window / 4)


class Breaker:
    def __init__(self, redis: AsyncRedis, keys: KeyLayout, config: BreakerConfig,
                 stats: StatsCollector, quota_of: Callable[[str], str] | None = None, *,
                 full: RedisFull | None = None) -> None:
        self.keys = keys
        # A site's quota key: on a cluster its breaker keys live in the quota's slot, where
        # gate.lua reads them with the quota's keys (KeyLayout.site_own).
        self.quota_of = quota_of or (lambda site: site)
        self.config = config
        self.stats = stats
        self._health = scripts.register(redis, "health")
        self._local: dict[str, _Window] = {}
        # site -> [n, errors, latency ms, probe, good answers, throttled]
        self._pending: dict[str, list[Any]] = {}
        # site -> (s of continuous trouble fleet-wide, monotonic time it was learnt)
        self._trouble: dict[str, tuple[float, float]] = {}
        #: Each site's state as last read from Redis (absent: closed); read it by :meth:`state_of`.
        self.state: dict[str, BreakerState] = {}
        self._opened_at: dict[str, float] = {}  # site -> monotonic time it was last seen opening
        self._next_flush = 0.0
        # A site whose breaker state Redis refuses; a full Redis is told to the worker's one
        # view of it (a breaker alone has its own).
        self.faults = SiteFaults("breaker", stats, full)

    def record(self, site: str, error: bool, latency_s: float, probe: bool,
               task_id: str = "", good: bool = False) -> None:
        """One download's outcome; ``good``: the site answered normally (not an error, not a
        429/403), which ends its trouble."""
        now = time.monotonic()
        window = self._local.get(site)
        if window is None:
            window = self._local[site] = _Window()
        window.add(now, error, latency_s, task_id)
        # Pruned here too: local_abnormal() only runs on failures, and a healthy site's window
        # otherwise grew by one entry per download for the life of the worker.
        window.prune(now - self.config.window)
        agg = self._pending.setdefault(site, [0, 0, 0, "", 0, 0])
        agg[0] += 1
        agg[1] += int(error)
        agg[2] += int(latency_s * 1000)
        agg[4] += int(good)
        if probe:
            agg[3] = "fail" if error else "ok"

    def throttled(self, site: str) -> None:
        """The site answered 429/403: trouble, told to the fleet at the next flush."""
        self._pending.setdefault(site, [0, 0, 0, "", 0, 0])[5] = 1

    def trouble_for(self, site: str) -> float:
        """Seconds of continuous trouble at the site, fleet-wide (0: none known)."""
        known = self._trouble.get(site)
        return 0.0 if known is None else known[0] + time.monotonic() - known[1]

    def given_up(self, site: str) -> str:
        """Why the site's waiting tasks are given up on ("" while not): its trouble lasted
        ``give_up`` seconds."""
        trouble = self.trouble_for(site)
        if site not in self._trouble or trouble < self.config.give_up:
            return ""
        since = datetime.now(timezone.utc) - timedelta(seconds=trouble)
        return (f"site down since {since.isoformat(timespec='seconds')} (gave up after "
                f"{self.config.give_up:.0f}s of continuous trouble)")

    def give_up_in(self, site: str) -> float | None:
        """Seconds until the site's tasks are given up on (None: no trouble)."""
        if site not in self._trouble:
            return None
        return max(0.0, self.config.give_up - self.trouble_for(site))

    def local_abnormal(self, site: str) -> bool:
        window = self._local.get(site)
        if window is None:
            return False
        window.prune(time.monotonic() - self.config.window)
        entries = window.entries
        n = len(entries)
        # This worker sees only its share of the site's traffic: judge it on a quarter of the
        # fleet's minimum, or a worker among several would never call a dead site abnormal.
        if n < max(3, -(-self.config.min_requests // 4)):
            return False
        # One URL failing over and over says nothing about the site: it uses up its own
        # retries instead of making its site look down. (Fewer errors than that: fewer
        # failing tasks, without looking at each.)
        if window.errors < MIN_FAILING_TASKS \
                or len({task for _, e, _, task in entries if e}) < MIN_FAILING_TASKS:
            return False
        mean = sum(lat for _, _, lat, _ in entries) / n
        return window.errors / n > self.config.error_ratio or mean > self.config.max_latency

    def state_of(self, site: str) -> BreakerState:
        """The site's breaker state as this worker last read it."""
        return BreakerState(self.state.get(site, BreakerState.CLOSED))

    def unhealthy(self, site: str) -> bool:
        """A site that looks down: its failing tasks are deferred without using up retries."""
        return self.state_of(site) is BreakerState.OPEN or self.local_abnormal(site)

    def open_for(self, site: str) -> float:
        """Seconds the site's breaker has been open without a pause (0 when not open)."""
        if self.state_of(site) is not BreakerState.OPEN:
            return 0.0
        return time.monotonic() - self._opened_at.get(site, time.monotonic())

    def degraded(self, site: str, priority: int) -> float:
        """How long a task of ``priority`` should be parked (0: as usual).

        A site open for long is not coming back soon: its low-priority tasks are parked for a
        long while so that the high-priority ones alone come back at each probe and get the
        first share of the ramp when the site recovers.
        """
        cfg = self.config
        if priority >= cfg.degrade_below or self.open_for(site) < cfg.degrade_after:
            return 0.0
        return cfg.degrade_delay

    async def flush(self) -> None:
        # Windows are seconds long: reporting four times a second is plenty, and keeps the
        # Redis round trips off a busy worker's hot path.
        now = time.monotonic()
        if now < self._next_flush:
            return
        self._next_flush = now + FLUSH_INTERVAL_S
        sites = (set(self._pending) | set(self._trouble)
                 | {s for s, st in self.state.items() if st != BreakerState.CLOSED})
        cfg = self.config
        for site in sites:
            if self.faults.blocked(site):
                continue
            pending = self._pending.pop(site, [0, 0, 0, "", 0, 0])
            n, errors, latency_ms, probe, good, throttled = pending
            quota = self.quota_of(site)
            try:
                reply = await self._health(
                    keys=[self.keys.site_own(site, quota, w)
                          for w in ("health", "breaker", "probe", "trouble")],
                    args=[n, errors, latency_ms, int(cfg.window), cfg.min_requests,
                          cfg.error_ratio, int(cfg.max_latency * 1000),
                          int(self.local_abnormal(site)), probe, int(cfg.ramp_step_s * 1000),
                          good, throttled, int(cfg.trouble_memory * 1000)],
                )
                state = BreakerState(str(reply[0]))
                fleet = reply[2:5]
                trouble_ms = int(reply[5])
            except SITE_ERRORS as exc:
                # This site's breaker state is corrupt: its counts wait for the next try, and
                # the other sites' breakers go on.
                self.faults.failed(site, exc)
                self._keep(site, pending)
                continue
            self.faults.ok(site)
            if trouble_ms >= 0:
                self._trouble[site] = (trouble_ms / 1000, time.monotonic())
            else:
                self._trouble.pop(site, None)
            before = self.state_of(site)
            self.state[site] = state
            if state is BreakerState.OPEN and before is not BreakerState.OPEN:
                self._opened_at[site] = time.monotonic()
            if state != before:
                self.stats.inc_value(f"meteorseed/breaker/{site}/{state.value}")
                log = logger.warning if state is BreakerState.OPEN else logger.info
                log("Circuit breaker of site %s: %s -> %s (fleet window: %s requests, %s errors, "
                    "mean latency %s ms)", site, before.value, state.value, *fleet)

    def _keep(self, site: str, pending: list[Any]) -> None:
        agg = self._pending.setdefault(site, [0, 0, 0, "", 0, 0])
        for i in (0, 1, 2, 4):
            agg[i] += pending[i]
        agg[3] = agg[3] or pending[3]
        agg[5] = agg[5] or pending[5]

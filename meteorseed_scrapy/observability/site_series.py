"""Per-site Prometheus series, a bounded number of them.

A broad crawl reaches 100 k sites; a series per site and outcome would be 100 k series per
worker. The first ``METEORSEED_METRICS_SITES`` sites a worker sees keep a label of their own
for the worker's life; every later one is counted under ``site="_other"``. Admission is sticky,
so each series only grows, as a Prometheus counter must (a "top N" that changes would move
counts between series and read as counter resets). ``0`` sends every site to ``_other``.

Counters come from two places: Scrapy's stats at scrape time (durable retries, 429/403
answers, breaker transitions, items checked and anomalous per site) and the worker's
``task_settled`` signal (requests per site by outcome). Breaker states come from
``breaker_state_changed``; how many sites have an open breaker is exact whatever the bound.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.politeness.breaker import BreakerState
from meteorseed_scrapy.sites.quality import STATS_PREFIX as ANOMALY_PREFIX

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

OTHER = "_other"

#: A family's samples: label values -> value.
Samples = dict[tuple[str, ...], float]

#: Stats prefixes exposed as ``meteorseed_<name>_total{site, <label>}`` counters.
SITE_COUNTERS = {
    "meteorseed/retry/": ("site_retries", "reason", "Durable retries per site, by reason"),
    "meteorseed/throttled/": ("site_throttled", "status", "429/403 answers per site"),
    "meteorseed/breaker/": ("site_breaker_transitions", "state",
                            "Circuit breaker transitions per site, by the new state"),
}
#: ``meteorseed/anomalies/<site>/<what>`` (sites/quality.py) -> a counter per site.
ANOMALY_COUNTERS = {
    "checked": ("site_items_checked", "Items whose fields were checked, per site"),
    "count": ("site_anomalies", "Items found anomalous (empty required field, broken "
                                "constraint), per site"),
}
#: Breaker states (health.lua) as gauge values; RAMP is the half-open recovery.
BREAKER_STATES = {BreakerState.CLOSED: 0, BreakerState.RAMP: 1, BreakerState.OPEN: 2}


class SiteLabels:
    """Which label a site's series get: its own id, or :data:`OTHER` past the bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._admitted: set[str] = set()
        self._lock = threading.Lock()  # the reactor and the scrape thread both ask

    def __call__(self, site: str) -> str:
        if site in self._admitted:
            return site
        with self._lock:
            if len(self._admitted) < self.limit:
                self._admitted.add(site)
                return site
        return OTHER


class SiteSeries:
    """The per-site families, read at scrape time (prometheus-client's thread) from copies."""

    def __init__(self, stats: StatsCollector, limit: int) -> None:
        self.stats = stats
        self.label = SiteLabels(limit)
        self._outcomes: Samples = {}  # (site label, outcome) -> tasks
        self._breakers: dict[str, BreakerState] = {}

    # -- fed on the reactor thread -------------------------------------------------------------
    def settled(self, site: str, outcome: str) -> None:
        key = (self.label(site), outcome)
        self._outcomes[key] = self._outcomes.get(key, 0) + 1

    def breaker(self, site: str, state: BreakerState) -> None:
        self._breakers[site] = state

    # -- read at scrape time -------------------------------------------------------------------
    def families(self) -> Iterator[tuple[str, str, str, list[str], Samples]]:
        """``(kind, name, help, labels, {label values: value})`` for every per-site family."""
        stats = dict(self.stats.get_stats())
        yield ("counter", "site_tasks", "Settled tasks per site, by outcome",
               ["site", "outcome"], self._outcomes.copy())
        for prefix, (name, label, doc) in SITE_COUNTERS.items():
            yield "counter", name, doc, ["site", label], self._by_site(stats, prefix)
        anomalies = self._by_site(stats, ANOMALY_PREFIX)
        for what, (name, doc) in ANOMALY_COUNTERS.items():
            yield "counter", name, doc, ["site"], {
                (site,): v for (site, kind), v in anomalies.items() if kind == what}
        breakers = dict(self._breakers)
        shown: Samples = {}
        for site, state in breakers.items():
            if (label := self.label(site)) != OTHER:
                shown[(label,)] = BREAKER_STATES.get(state, -1)
        yield ("gauge", "site_breaker_state",
               "Breaker state per site (0 closed, 1 half-open, 2 open)", ["site"], shown)
        yield ("gauge", "breakers_open", "Sites whose breaker is open now (every site)", [],
               {(): sum(state == BreakerState.OPEN for state in breakers.values())})

    def _by_site(self, stats: dict[str, Any], prefix: str) -> Samples:
        out: Samples = {}
        for name, value in stats.items():
            rest = name[len(prefix):]
            if name.startswith(prefix) and "/" in rest and isinstance(value, (int, float)):
                site, _, kind = rest.rpartition("/")
                key = (self.label(site), kind)
                out[key] = out.get(key, 0) + value
        return out

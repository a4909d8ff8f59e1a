"""The queue status snapshot (:mod:`meteorseed_scrapy.queue.inspect.status` reads it) and its JSON,
the
one shape of ``meteorseed status --json`` and of ``GET /status``."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from meteorseed_scrapy.queue.fleet.delayed import DelayedEntry
from meteorseed_scrapy.queue.plumbing.replies import text_of


@dataclass(frozen=True)
class Depth:
    backlog: int = 0  # waiting to be delivered
    pending: int = 0  # delivered to a consumer, not acked yet

    def to_json(self) -> dict[str, int]:
        return {"backlog": self.backlog, "pending": self.pending}


@dataclass(frozen=True)
class LaneStatus:
    bands: dict[str, Depth]

    @property
    def backlog(self) -> int:
        return sum(d.backlog for d in self.bands.values())

    @property
    def pending(self) -> int:
        return sum(d.pending for d in self.bands.values())


@dataclass(frozen=True)
class ShardStatus:
    index: int
    stream: str
    backlog: int
    pending: int
    delayed: int
    dead: int | None  # None: the shards share one dead-letter stream (one Redis)


@dataclass(frozen=True)
class SpiderStatus:
    """One task set: a spider's (``spider``), or the default one (None: tasks that name no
    spider, which every worker reads)."""

    spider: str | None
    backlog: int
    pending: int
    delayed: int
    workers: int  # live workers that read it

    @property
    def unserved(self) -> bool:
        """Tasks wait, and no live worker runs the spider they name."""
        return self.workers == 0 and (self.backlog + self.delayed) > 0

    def to_json(self) -> dict[str, Any]:
        return {"spider": self.spider, "backlog": self.backlog, "pending": self.pending,
                "delayed": self.delayed, "workers": self.workers, "unserved": self.unserved}


@dataclass(frozen=True)
class ConsumerStatus:
    name: str
    pending: int  # summed over every task stream
    idle_s: float  # since it last read or acked (the least over the streams)
    last_seen_at: float  # epoch seconds, Redis time


@dataclass(frozen=True)
class DelayedSite:
    site_id: str | None  # None: entries whose message is not a task's (damaged)
    count: int
    reasons: dict[str, int]
    next_due_at: float | None


@dataclass(frozen=True)
class DelayedStatus:
    total: int  # every entry of every delayed set (exact)
    next_due_at: float | None  # the soonest due (exact); None: none, or never due
    scanned: int  # reasons and sites count the soonest ``scanned`` entries of ``total``
    reasons: dict[str, int]
    sites: tuple[DelayedSite, ...]  # most delayed first, then the soonest due


def summarize_delayed(total: int, shards: Iterable[list[DelayedEntry]]) -> DelayedStatus:
    """``shards``: the soonest entries of each delayed set, in due order (ZRANGE)."""
    reasons: dict[str, int] = {}
    sites: dict[str | None, tuple[int, dict[str, int], float | None]] = {}
    firsts: list[float] = []
    scanned = 0
    for entries in shards:
        if entries and entries[0].due_at is not None:
            firsts.append(entries[0].due_at)
        for entry in entries:
            scanned += 1
            reasons[entry.why] = reasons.get(entry.why, 0) + 1
            count, why, due = sites.get(entry.site_id, (0, {}, None))
            why[entry.why] = why.get(entry.why, 0) + 1
            if due is None or (entry.due_at is not None and entry.due_at < due):
                due = entry.due_at
            sites[entry.site_id] = (count + 1, why, due)
    rows = sorted((DelayedSite(site, count, _by_count(why), due)
                   for site, (count, why, due) in sites.items()),
                  key=lambda r: (-r.count, math.inf if r.next_due_at is None
                                 else r.next_due_at, r.site_id or ""))
    return DelayedStatus(total, min(firsts, default=None), scanned, _by_count(reasons),
                         tuple(rows))


def _by_count(counts: dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _due(at: float | None, now: float) -> dict[str, float | None]:
    """When, and in how long (negative: overdue, no worker promotes it)."""
    if at is None:
        return {"next_due_at": None, "next_due_in_s": None}
    return {"next_due_at": round(at, 3), "next_due_in_s": round(at - now, 1)}


@dataclass(frozen=True)
class SiteThrottle:
    """A site's fleet-wide adaptive limit and robots.txt cap (politeness/adaptive.py), as Redis
    holds them; keyed by the site's quota (its ``limits.quota_key``, else its id)."""

    site_id: str
    delay_s: float | None  # between two requests of the whole fleet (None: not adaptive now)
    latency_s: float | None  # mean of the last window, every worker's responses
    in_flight: int  # concurrency leases held now, fleet-wide
    robots_interval_s: float | None  # robots.txt asks this between two requests (None: no)

    @property
    def target_rate(self) -> float | None:
        """Requests a second the site may get (before its configured ceiling, a 429's
        tightening and the breaker's ramp)."""
        rates = [1 / x for x in (self.delay_s, self.robots_interval_s) if x]
        return min(rates) if rates else None

    def to_json(self) -> dict[str, Any]:
        def rounded(x: float | None, digits: int = 3) -> float | None:
            return None if x is None else round(x, digits)

        return {"site_id": self.site_id, "target_rate": rounded(self.target_rate),
                "delay_s": rounded(self.delay_s, 4), "latency_ms": rounded(
                    None if self.latency_s is None else self.latency_s * 1000, 1),
                "in_flight": self.in_flight, "robots_interval_s": rounded(
                    self.robots_interval_s)}


@dataclass(frozen=True)
class RedisMemory:
    """Redis's ``INFO memory``: what it holds, the most it may hold, what it does then."""

    used_bytes: int
    max_bytes: int  # 0: no limit (Redis grows until the machine says no)
    policy: str  # maxmemory-policy

    #: Past this fraction of ``maxmemory`` the operator is warned (status, alert rules).
    WARN_FRACTION = 0.8

    @property
    def fraction(self) -> float | None:
        return self.used_bytes / self.max_bytes if self.max_bytes else None

    @property
    def near_limit(self) -> bool:
        return self.fraction is not None and self.fraction >= self.WARN_FRACTION

    @property
    def full(self) -> bool:
        """At its ``maxmemory``: with ``noeviction``, Redis refuses writes."""
        return bool(self.max_bytes) and self.used_bytes >= self.max_bytes

    @classmethod
    def parse(cls, info: Any) -> RedisMemory | None:
        """From redis-py's parsed ``INFO memory`` (None when Redis refused it: a managed
        Redis may rename INFO)."""
        if not isinstance(info, dict):
            return None
        try:
            used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        except (TypeError, ValueError):
            return None
        return cls(used, limit, text_of(info.get("maxmemory_policy", "")))

    def to_json(self) -> dict[str, Any]:
        fraction = self.fraction
        return {"used_bytes": self.used_bytes, "max_bytes": self.max_bytes,
                "policy": self.policy,
                "used_fraction": None if fraction is None else round(fraction, 4),
                "near_limit": self.near_limit}


@dataclass(frozen=True)
class QueueStatus:
    namespace: str
    stream: str  # the first shard's main stream (<ns>:tasks on one Redis)
    at: float  # Redis TIME, epoch seconds
    lanes: dict[str, LaneStatus]
    shards: tuple[ShardStatus, ...]
    consumers: tuple[ConsumerStatus, ...]
    delayed: DelayedStatus
    dead: int
    added: int | None  # new tasks ever added to the streams (not re-adds); None: unreadable
    lag_s: float  # age of the oldest task waiting to be delivered (0 when none waits)
    throttles: tuple[SiteThrottle, ...] = ()  # sites with an adaptive limit or robots cap
    #: Age of the oldest task waiting per lane (lanes with none waiting: absent).
    lane_lag_s: dict[str, float] = field(default_factory=dict)
    #: Workers whose liveness deadline has not passed (the live-worker registry).
    live_workers: int | None = None
    memory: RedisMemory | None = None  # None: INFO refused
    spiders: tuple[SpiderStatus, ...] = ()  # per task set: the default one, then by spider

    @property
    def backlog(self) -> int:
        return sum(lane.backlog for lane in self.lanes.values())

    @property
    def pending(self) -> int:
        return sum(lane.pending for lane in self.lanes.values())

    @property
    def length(self) -> int:
        """XLEN summed over every task stream: waiting + pending."""
        return self.backlog + self.pending

    @property
    def finished(self) -> int | None:
        """Tasks settled for good (acked, dead-lettered) since counting began: new tasks
        neither in a stream nor deferred (0 at least: a namespace older than the counter holds
        tasks it never counted)."""
        return None if self.added is None else max(0, self.added - self.length
                                                   - self.delayed.total)

    def to_json(self) -> dict[str, Any]:
        delayed = self.delayed
        return {
            "namespace": self.namespace,
            "stream": self.stream,
            "backlog": self.backlog,
            "pending": self.pending,
            "stream_length": self.length,
            "lag_s": round(self.lag_s, 3),
            "lanes": {lane: {"backlog": v.backlog, "pending": v.pending,
                             "bands": {b: d.to_json() for b, d in v.bands.items()}}
                      for lane, v in self.lanes.items()},
            "shards": [{"shard": s.index, "stream": s.stream, "backlog": s.backlog,
                        "pending": s.pending, "delayed": s.delayed, "dead": s.dead}
                       for s in self.shards],
            "dead": self.dead,
            "delayed": {
                "total": delayed.total, **_due(delayed.next_due_at, self.at),
                "scanned": delayed.scanned, "reasons": delayed.reasons,
                "sites": [{"site_id": s.site_id, "count": s.count, "reasons": s.reasons,
                           **_due(s.next_due_at, self.at)} for s in delayed.sites],
            },
            "consumers": [{"name": c.name, "pending": c.pending,
                           "idle_ms": int(c.idle_s * 1000),
                           "last_seen_at": round(c.last_seen_at, 3)}
                          for c in self.consumers],
            "throughput": {"added_total": self.added, "finished_total": self.finished},
            "throttles": [t.to_json() for t in self.throttles],
            "lane_lag_s": {lane: round(lag, 3) for lane, lag in self.lane_lag_s.items()},
            "live_workers": self.live_workers,
            "redis_memory": None if self.memory is None else self.memory.to_json(),
            "spiders": [sp.to_json() for sp in self.spiders],
        }


__all__ = ["ConsumerStatus", "DelayedSite", "DelayedStatus", "Depth", "LaneStatus",
           "QueueStatus", "RedisMemory", "ShardStatus", "SiteThrottle", "SpiderStatus",
           "summarize_delayed"]

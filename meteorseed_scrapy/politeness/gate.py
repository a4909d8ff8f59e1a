"""The Redis side of politeness: permits (token + concurrency lease), pauses, the delayed set."""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meteorseed_scrapy.politeness.adaptive import (
    FLUSH_INTERVAL_S,
    STATE_TTL_S,
    AdaptiveState,
    LatencySamples,
)
from meteorseed_scrapy.politeness.control import HOLD_KEYS, HOLD_RECHECK_S
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.politeness.site_errors import SITE_ERRORS
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.replies import text_of

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

LEASE_TTL_S = 30.0  # the longest lease; renewed every third of its life while in flight
#: The shortest: renewals ride the permit loop, which runs about once a second.
LEASE_MIN_S = 5.0
#: A task deferred for its site's pause is due back in its stream this long before the pause
#: ends: the delayed set is promoted about once a second, and the gate holds the task back until
#: the pause is over all the same, so the site resumes when its pause ends, not up to 1 s later.
PAUSE_LEAD_S = 1.0
#: How long a robots.txt cap is remembered in Redis, and how often a worker records it again.
ROBOTS_CAP_TTL_S = 86400.0
ROBOTS_CAP_REFRESH_S = 3600.0


@dataclass(frozen=True)
class Grant:
    lease_ids: list[str]
    wait_s: float  # when asking again makes sense (0 when something was granted)
    held: bool = False  # an operator holds the site (wait_s: HOLD_RECHECK_S; until resumed)


@dataclass(frozen=True)
class PauseResult:
    strikes: int
    pause_s: float  # the site's pause in force (what its deferred tasks wait)
    new_strike: bool = True  # False: the request was in flight when the pause began


def granted_at(lease: object) -> int | None:
    """Redis time (ms) a lease id from ``gate.lua`` was granted; None for anything else (no
    lease, an older id, a value that is not one)."""
    if not isinstance(lease, str):
        return None
    _, at, rest = lease.rpartition("@")
    ms, sep, _ = rest.partition(":")
    if not (at and sep and ms.isascii() and ms.isdigit()) or len(ms) > 15:
        return None
    return int(ms) or None


def lease_ttl(claim_idle_s: float) -> float:
    """A concurrency lease's life for workers whose tasks are reclaimed after ``claim_idle_s``.

    A dead worker's tasks go to the others after CLAIM_IDLE; its leases must not hold the
    site's concurrency slots much longer, or those tasks wait for them (at 30 s with the 10 s
    default, the reclaimed tasks of a site at its cap waited 20 s more)."""
    return max(LEASE_MIN_S, min(LEASE_TTL_S, claim_idle_s))


class SiteGate:
    """Fleet-wide permits per site: ``acquire`` charges tokens and takes concurrency leases
    that live ``lease_ttl_s`` unless renewed."""

    def __init__(self, redis: AsyncRedis, keys: KeyLayout, limits_for: Callable[[str], SiteLimits],
                 consumer: str, backoff: Backoff, probe_interval_s: float = 60.0, *,
                 lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.probe_interval_s = probe_interval_s
        self.lease_ttl_s = lease_ttl_s
        self.redis = redis
        self.keys = keys
        self.limits_for = limits_for
        self.backoff = backoff
        self._prefix = consumer
        self._calls = itertools.count(1)
        self._gate = scripts.register(redis, "gate")
        self._renew = scripts.register(redis, "renew")
        self._pause = scripts.register(redis, "pause")
        self._adaptive = scripts.register(redis, "adaptive")
        self.samples = LatencySamples()  # responses of adaptive sites since the last flush
        self._next_flush = 0.0
        self._listed: dict[str, float] = {}  # quota -> monotonic time it was last indexed
        # quota -> monotonic end of its pause as this worker last learnt it: permits in hand
        # are not used meanwhile (the fleet learns it from the gate).
        self._paused_until: dict[str, float] = {}

    def _site_keys(self, site: str, *what: str) -> list[str]:
        return [self.keys.site(site, w) for w in what]

    def _quota_keys(self, site: str, *what: str) -> list[str]:
        # Sites sharing a quota key share its bucket, leases, pause and tightening; the
        # breaker stays the site's own (one site of a host may be down alone).
        return self._site_keys(self.limits_for(site).quota(site), *what)

    async def acquire(self, site: str, wanted: int) -> Grant:
        limits = self.limits_for(site)
        throttle = limits.throttle
        reply = await self._gate(
            keys=[*self._quota_keys(site, "bucket", "pause", "leases", "tighten"),
                  *(self.keys.site_own(site, limits.quota(site), w) for w in ("breaker", "probe")),
                  *self._quota_keys(site, "adaptive", "robots"),
                  *(self.keys.site_own(site, limits.quota(site), w) for w in HOLD_KEYS)],
            args=[limits.rate, limits.burst, limits.concurrency, int(self.lease_ttl_s * 1000),
                  wanted, f"{self._prefix}:{next(self._calls)}", int(self.probe_interval_s * 1000),
                  int(limits.adaptive), round(throttle.start_delay * 1000, 3),
                  throttle.concurrency, max(1, math.floor(throttle.target)),
                  int(limits.crawl_delay), int(HOLD_RECHECK_S * 1000)],
        )
        granted, wait_ms = int(reply[0]), int(reply[1])
        held = not granted and len(reply) > 2 and text_of(reply[2]) == "held"
        return Grant([str(x) for x in reply[2: 2 + granted]], wait_ms / 1000, held)

    async def release(self, leases: Iterable[tuple[str, str]]) -> dict[str, Exception]:
        """Give back ``(site, lease id)`` pairs: the request finished or was never sent.
        Returns the sites whose leases could not be given back (corrupt state: they expire)."""
        sites = []
        async with self.redis.pipeline(transaction=False) as pipe:
            for site, lease in leases:
                pipe.zrem(*self._quota_keys(site, "leases"), lease)
                sites.append(site)
            replies = await pipe.execute(raise_on_error=False)
        return {s: r for s, r in zip(sites, replies, strict=True) if isinstance(r, Exception)}

    async def renew(self, by_site: dict[str, list[str]]) -> dict[str, Exception]:
        """Renew the leases of requests in flight. Returns the sites whose state refused it
        (site -> the error); the other sites are renewed all the same."""
        failed: dict[str, Exception] = {}
        for site, leases in by_site.items():
            if leases:
                try:
                    await self._renew(keys=self._quota_keys(site, "leases"),
                                      args=[int(self.lease_ttl_s * 1000), *leases])
                except SITE_ERRORS as exc:
                    failed[site] = exc
        return failed

    async def pause(self, site: str, retry_after: float | None,
                    granted_ms: int | None = None) -> PauseResult:
        """A 429/403 to a request whose permit was granted at ``granted_ms`` (Redis time;
        None: unknown). A new strike pauses the site fleet-wide (growing with consecutive
        strikes) and tightens it; a request in flight when the pause began only confirms it."""
        quota = self.limits_for(site).quota(site)
        # Until Redis answers, this worker holds the site back (set before the first await, so
        # no permit in hand goes out meanwhile).
        self._hold(quota, retry_after if retry_after else self.backoff.base)
        reply = await self._pause(
            keys=self._site_keys(quota, "pause", "strikes", "tighten"),
            args=[int((retry_after or 0) * 1000), int(self.backoff.base * 1000),
                  int(self.backoff.cap * 1000), round(random.uniform(0, self.backoff.jitter), 3),
                  600_000, 0.5, 300_000, granted_ms or 0],
        )
        result = PauseResult(int(reply[0]), int(reply[1]) / 1000, bool(int(reply[2])))
        self._paused_until[quota] = time.monotonic() + result.pause_s
        return result

    def _hold(self, quota: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        if end > self._paused_until.get(quota, 0.0):
            self._paused_until[quota] = end

    def held_back(self, site: str) -> float:
        """Seconds the site's pause lasts, as this worker learnt it from its own 429/403s (0:
        none known): permits in hand for it wait, or go back."""
        if not self._paused_until:
            return 0.0
        quota = self.limits_for(site).quota(site)
        end = self._paused_until.get(quota)
        if end is None:
            return 0.0
        left = end - time.monotonic()
        if left <= 0:
            del self._paused_until[quota]
            return 0.0
        return left

    # -- the fleet-wide adaptive limit (politeness/adaptive.py) --------------------------------
    def observe(self, site: str, latency_s: float, status: int) -> None:
        """A response of ``site`` took ``latency_s``: a sample for its adaptive delay (only a
        200 may lower it, as in Scrapy), flushed with the permit loop."""
        limits = self.limits_for(site)
        if limits.adaptive:
            self.samples.add(limits.quota(site), latency_s, status == 200)

    async def flush_samples(self, force: bool = False) -> dict[str, AdaptiveState]:
        """Send the samples summed since the last flush (at most every ``FLUSH_INTERVAL_S``):
        one script call per site. Returns each flushed site's state; a site whose state Redis
        refuses keeps its samples for the next flush and raises nothing here."""
        now = time.monotonic()
        if not self.samples or (now < self._next_flush and not force):
            return {}
        self._next_flush = now + FLUSH_INTERVAL_S
        out: dict[str, AdaptiveState] = {}
        for quota, sums in self.samples.take().items():
            throttle = self.limits_for(quota).throttle
            try:
                delay_ms, latency_ms = await self._adaptive(
                    keys=[self.keys.site(quota, "adaptive")],
                    args=[int(sums[0]), round(sums[1], 3), int(sums[2]), round(sums[3], 3),
                          *throttle.args(), int(FLUSH_INTERVAL_S * 1000),
                          int(STATE_TTL_S * 1000)])
                out[quota] = AdaptiveState(float(delay_ms) / 1000,
                                           float(latency_ms) / 1000 if latency_ms else None)
            except SITE_ERRORS:
                self.samples.put_back(quota, sums)
                continue
            if now - self._listed.get(quota, -math.inf) >= STATE_TTL_S / 10:
                self._listed[quota] = now
                await self._index(quota)
        return out

    async def _index(self, quota: str) -> None:
        """List ``quota`` where ``meteorseed status`` finds adaptive and capped sites (another
        slot than the site's keys on a cluster: its own commands; sites quiet for a day go)."""
        now = time.time()
        with contextlib.suppress(*SITE_ERRORS):
            await self.redis.zadd(self.keys.adaptive_sites, {quota: now})
            await self.redis.zremrangebyscore(self.keys.adaptive_sites, "-inf",
                                              now - ROBOTS_CAP_TTL_S)

    async def cap_by_robots(self, site: str, host: str, interval_s: float | None) -> bool:
        """A worker read robots.txt of ``host``: it asks at least ``interval_s`` between two
        requests (None: no such rule, or robots.txt could not be read). The site's fleet-wide
        rate is capped accordingly, unless its rule config ignores the Crawl-delay; until the
        first such record the gate lets one request of the site go at a time. Returns whether
        a cap applies."""
        limits = self.limits_for(site)
        if not limits.crawl_delay:
            return False
        capped = interval_s is not None and interval_s > 0 and math.isfinite(interval_s)
        key = self.keys.site(limits.quota(site), "robots")
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, host, round(min(interval_s or 0.0, 86_400.0) * 1000, 3)
                      if capped else 0)
            pipe.pexpire(key, int(ROBOTS_CAP_TTL_S * 1000))
            if capped:  # the tokens saved up before the cap was known may not go as a burst
                pipe.hset(self.keys.site(limits.quota(site), "bucket"), "tokens", 0)
            await pipe.execute()
        if capped:
            await self._index(limits.quota(site))
        return capped


def group_by_site(pairs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for site, lease in pairs:
        out.setdefault(site, []).append(lease)
    return out

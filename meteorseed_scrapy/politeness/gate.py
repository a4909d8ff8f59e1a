"""The Redis side of politeness: permits (token + concurrency lease), pauses, the delayed set."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue import scripts
from meteorseed_scrapy.queue.delayed import reason_code
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.shards import call_scripts
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.task.lanes import band_of

LEASE_TTL_S = 30.0  # renewed every ~LEASE_TTL_S / 3 while a request is in flight


@dataclass(frozen=True)
class Grant:
    lease_ids: list[str]
    wait_s: float  # when asking again makes sense (0 when something was granted)


@dataclass(frozen=True)
class PauseResult:
    strikes: int
    pause_s: float


class SiteGate:
    """Fleet-wide permits per site: ``acquire`` charges tokens and takes concurrency leases."""

    def __init__(self, redis: Any, keys: KeyLayout, limits_for: Callable[[str], SiteLimits],
                 consumer: str, backoff: Backoff, probe_interval_s: float = 60.0) -> None:
        self.probe_interval_s = probe_interval_s
        self.redis = redis
        self.keys = keys
        self.limits_for = limits_for
        self.backoff = backoff
        self._prefix = consumer
        self._calls = itertools.count(1)
        self._gate = scripts.register(redis, "gate")
        self._renew = scripts.register(redis, "renew")
        self._pause = scripts.register(redis, "pause")
        self._defer = scripts.register(redis, "defer")
        self._promote = scripts.register(redis, "promote")

    def _site_keys(self, site: str, *what: str) -> list[str]:
        return [self.keys.site(site, w) for w in what]

    def _quota_keys(self, site: str, *what: str) -> list[str]:
        # Sites sharing a quota key share its bucket, leases, pause and tightening; the
        # breaker stays the site's own (one site of a host may be down alone).
        return self._site_keys(self.limits_for(site).quota(site), *what)

    async def acquire(self, site: str, wanted: int) -> Grant:
        limits = self.limits_for(site)
        reply = await self._gate(
            keys=[*self._quota_keys(site, "bucket", "pause", "leases", "tighten"),
                  *(self.keys.site_own(site, limits.quota(site), w) for w in ("breaker", "probe"))],
            args=[limits.rate, limits.burst, limits.concurrency, int(LEASE_TTL_S * 1000), wanted,
                  f"{self._prefix}:{next(self._calls)}", int(self.probe_interval_s * 1000)],
        )
        granted, wait_ms = int(reply[0]), int(reply[1])
        return Grant([str(x) for x in reply[2: 2 + granted]], wait_ms / 1000)

    async def release(self, leases: Iterable[tuple[str, str]]) -> None:
        """Give back ``(site, lease id)`` pairs: the request finished or was never sent."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for site, lease in leases:
                pipe.zrem(*self._quota_keys(site, "leases"), lease)
            await pipe.execute()

    async def renew(self, by_site: dict[str, list[str]]) -> None:
        for site, leases in by_site.items():
            if leases:
                await self._renew(keys=self._quota_keys(site, "leases"),
                                  args=[int(LEASE_TTL_S * 1000), *leases])

    async def pause(self, site: str, retry_after: float | None) -> PauseResult:
        """A 429/403: pause the site fleet-wide (growing with consecutive strikes), tighten it."""
        reply = await self._pause(
            keys=self._quota_keys(site, "pause", "strikes", "tighten"),
            args=[int((retry_after or 0) * 1000), int(self.backoff.base * 1000),
                  int(self.backoff.cap * 1000), round(random.uniform(0, self.backoff.jitter), 3),
                  600_000, 0.5, 300_000],
        )
        return PauseResult(int(reply[0]), int(reply[1]) / 1000)

    async def paused_for(self, site: str) -> float:
        ms = int(await self.redis.pttl(*self._quota_keys(site, "pause")))
        return max(0.0, ms / 1000)

    async def defer(self, ref: tuple[str, str], task: ExecTask, delay_s: float,
                    lane: str = "", why: DeferReason = DeferReason.OTHER) -> bool:
        """Ack the message ``ref`` (stream, id) and put ``task`` in the delayed set, due in
        ``delay_s`` (Redis time), for the task stream of ``lane`` ("" = the task's own);
        ``why`` is recorded with it (``meteorseed status`` counts them by reason)."""
        route = f"{lane or task.lane}:{band_of(task.priority)}"
        done = await self._defer(
            keys=[ref[0], self.keys.shard_of_stream(ref[0]).delayed],
            args=[self.keys.group, ref[1], int(delay_s * 1000), f"{route}|{task.to_message()['t']}",
                  "1", reason_code(why)],
        )
        return bool(done)

    async def promote(self, limit: int = 500) -> float:
        """Move due tasks to their streams (each shard's delayed set to that shard's streams);
        returns seconds until the next is due (-1: none)."""
        calls = []
        for shard in self.keys.shard_keys:
            routes = [":".join(shard.stream_lanes[s]) for s in shard.streams]
            calls.append(([shard.delayed, *shard.streams],
                          [limit, MESSAGE_VERSION, shard.streams.index(shard.stream) + 1, *routes]))
        waits = []
        for moved, wait_ms in await call_scripts(self.redis, self._promote, calls):
            if int(moved) >= limit:
                return 0.0
            if int(wait_ms) >= 0:
                waits.append(int(wait_ms) / 1000)
        return min(waits, default=-1.0)


def group_by_site(pairs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for site, lease in pairs:
        out.setdefault(site, []).append(lease)
    return out

"""Concurrency leases live about as long as CLAIM_IDLE: a dead worker's share of a site's
concurrency comes back when its tasks do, not 20 s later (real Redis)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from meteorseed_scrapy.politeness.gate import (
    LEASE_MIN_S,
    LEASE_TTL_S,
    SiteGate,
    granted_at,
    lease_ttl,
)
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.testing.clients import run_with_client


@pytest.mark.parametrize(("claim_idle", "ttl"), [
    (DEFAULTS["METEORSEED_CLAIM_IDLE"], 10.0),  # the default: leases end with the tasks' claim
    (0.5, LEASE_MIN_S),  # renewals ride a loop of about a second: never shorter than this
    (600.0, LEASE_TTL_S),  # a long CLAIM_IDLE does not keep a crashed worker's slots longer
])
def test_lease_ttl_follows_claim_idle_within_bounds(claim_idle: float, ttl: float) -> None:
    assert lease_ttl(claim_idle) == ttl


@pytest.mark.parametrize("claim_idle", [0.5, 10.0, 45.0])
def test_leases_are_granted_and_renewed_for_the_gates_ttl(
    redis_url: str, namespace: str, sync_redis: redis.Redis, claim_idle: float
) -> None:
    keys = KeyLayout(namespace)
    limits = SiteLimits(rate=100.0, burst=10, concurrency=3)
    ttl_ms = int(lease_ttl(claim_idle) * 1000)

    async def scenario(client: Any) -> tuple[list[str], dict[str, int]]:
        gate = SiteGate(client, keys, lambda _site: limits, "c1", Backoff(1.0, 300.0),
                        lease_ttl_s=lease_ttl(claim_idle))
        grant = await gate.acquire("s", 5)
        renewed_at = int(float((await client.time())[0]) * 1000)
        await gate.renew({"s": grant.lease_ids[:1]})
        scores = {m: int(s) for m, s in await client.zrange(keys.site("s", "leases"), 0, -1,
                                                             withscores=True)}
        scores["_renewed_at"] = renewed_at
        return grant.lease_ids, scores

    leases, scores = run_with_client(redis_url, scenario)
    assert len(leases) == 3  # the site's cap
    first, *rest = leases
    for lease in rest:  # expiry = grant time (Redis clock) + the gate's ttl
        at = granted_at(lease)
        assert at is not None and scores[lease] == at + ttl_ms
    # the renewed one: a fresh ttl from the renewal (Redis's clock, within the second read)
    assert scores["_renewed_at"] + ttl_ms - 1000 <= scores[first] <= scores["_renewed_at"] \
        + ttl_ms + 1000

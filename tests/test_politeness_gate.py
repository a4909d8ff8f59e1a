"""The Redis side of politeness against a real Redis: permits, leases, pauses, the delayed set."""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

import pytest
import redis

from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits, parse_retry_after
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.testing.polling import wait_until
from meteorseed_scrapy.validators import ConfigError

T = TypeVar("T")




def make_gate(client: Any, ns: str, limits: SiteLimits, base: float = 1.0) -> SiteGate:
    return SiteGate(client, KeyLayout(ns), lambda _site: limits, "c1", Backoff(base, 300.0))


def test_a_fresh_site_grants_its_burst_then_nothing_until_tokens_refill(
    redis_url: str, namespace: str
) -> None:
    limits = SiteLimits(rate=2.0, burst=5, concurrency=100)

    async def scenario(client: Any) -> tuple[int, int, float]:
        gate = make_gate(client, namespace, limits)
        first = await gate.acquire("s", 10)
        second = await gate.acquire("s", 10)
        return len(first.lease_ids), len(second.lease_ids), second.wait_s

    burst, after, wait = run(redis_url, scenario)
    assert burst == 5
    assert after == 0
    assert 0 < wait <= 0.5  # one token every 0.5 s at 2 req/s


def test_tokens_refill_at_the_rate_measured_by_redis_time(redis_url: str, namespace: str) -> None:
    limits = SiteLimits(rate=10.0, burst=1, concurrency=100)

    async def scenario(client: Any) -> int:
        gate = make_gate(client, namespace, limits)
        granted = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            granted += len((await gate.acquire("s", 5)).lease_ids)
            await asyncio.sleep(0.01)
        return granted

    granted = run(redis_url, scenario)
    # One second at 10/s plus the burst of 1: never more, whatever the polling does.
    assert granted <= 12
    assert granted >= 5


def test_concurrency_leases_cap_the_site_and_come_back_on_release(
    redis_url: str, namespace: str
) -> None:
    limits = SiteLimits(rate=1000.0, burst=1000, concurrency=3)

    async def scenario(client: Any) -> tuple[int, int, int]:
        gate = make_gate(client, namespace, limits)
        first = await gate.acquire("s", 10)
        blocked = await gate.acquire("s", 10)
        await gate.release([("s", first.lease_ids[0])])
        again = await gate.acquire("s", 10)
        return len(first.lease_ids), len(blocked.lease_ids), len(again.lease_ids)

    assert run(redis_url, scenario) == (3, 0, 1)


def test_leases_of_a_dead_worker_expire(redis_url: str, namespace: str,
                                        sync_redis: redis.Redis) -> None:
    limits = SiteLimits(rate=1000.0, burst=1000, concurrency=2)
    key = KeyLayout(namespace).site("s", "leases")

    async def take(client: Any) -> list[str]:
        return (await make_gate(client, namespace, limits).acquire("s", 5)).lease_ids

    leases = run(redis_url, take)
    assert len(leases) == 2
    # Pretend they were taken long ago and never renewed: the gate drops them.
    for lease in leases:
        sync_redis.zadd(key, {lease: 1})
    assert len(run(redis_url, take)) == 2


def test_a_pause_blocks_every_worker_and_grows_with_strikes(
    redis_url: str, namespace: str
) -> None:
    limits = SiteLimits(rate=1000.0, burst=1000, concurrency=100)

    async def scenario(client: Any) -> tuple[float, float, int, float, float]:
        gate = make_gate(client, namespace, limits, base=1.0)
        other_worker = SiteGate(client, KeyLayout(namespace), lambda _s: limits, "c2",
                                Backoff(1.0, 300.0))
        first = await gate.pause("s", retry_after=3.0)
        blocked = await other_worker.acquire("s", 1)
        second = await gate.pause("s", retry_after=None)
        third = await gate.pause("s", retry_after=None)
        return first.pause_s, blocked.wait_s, len(blocked.lease_ids), second.pause_s, third.pause_s

    first, wait, granted, second, third = run(redis_url, scenario)
    assert 3.0 <= first <= 3.3  # Retry-After wins over base * 2^0, plus up to 10 % jitter
    assert granted == 0 and 2.5 < wait <= 3.3
    assert second >= first - 0.1  # a pause never shrinks
    assert third >= 4.0  # base * 2^2 on the third strike


def test_a_pause_tightens_the_rate(redis_url: str, namespace: str) -> None:
    limits = SiteLimits(rate=4.0, burst=1, concurrency=100)

    async def scenario(client: Any) -> float:
        gate = make_gate(client, namespace, limits, base=0.001)
        await gate.pause("s", retry_after=None)

        async def granted() -> bool:  # once the 1 ms pause is over: spends the token
            return bool((await gate.acquire("s", 1)).lease_ids)

        await wait_until(granted, 10, 0.01)
        return (await gate.acquire("s", 1)).wait_s

    # At half the rate a token takes 0.5 s instead of 0.25 s.
    assert run(redis_url, scenario) > 0.3


def test_deferred_tasks_come_back_when_due_exactly_once(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)
    task = ExecTask.create(seed_id="s", site_id="site", url="http://127.0.0.1:1/x")

    async def scenario(client: Any) -> tuple[bool, float, float, float]:
        await TaskWriter(client, keys).add([task])
        await client.xgroup_create(keys.stream, keys.group, id="0")
        reply = await client.xreadgroup(keys.group, "c1", {keys.stream: ">"}, count=1)
        msg_id = reply[0][1][0][0]
        delayed = DelayedSet(client, keys)
        moved = await delayed.defer((keys.stream, msg_id), task, 0.3)
        early = await delayed.promote()

        async def due() -> bool:  # by Redis time, as promote.lua sees it (ms)
            ((_, due_ms),) = await client.zrange(keys.delayed, 0, 0, withscores=True)
            secs, usecs = await client.time()
            return bool(due_ms <= int(secs) * 1000 + int(usecs) // 1000)

        await wait_until(due, 10, 0.02)
        other = DelayedSet(client, keys)
        due, again = await asyncio.gather(delayed.promote(), other.promote())
        return moved, early, due, again

    moved, early, due, again = run(redis_url, scenario)
    assert moved
    assert 0 < early <= 0.3
    assert due == -1 and again == -1
    entries = sync_redis.xrange(keys.stream)
    assert len(entries) == 1
    assert ExecTask.from_message(entries[0][1]) == task
    assert sync_redis.zcard(keys.delayed) == 0
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 0


def test_backoff_grows_caps_and_honours_retry_after() -> None:
    backoff = Backoff(1.0, 10.0, jitter=0.0)
    assert [backoff.compute(n) for n in range(5)] == [1, 2, 4, 8, 10]
    assert backoff.compute(0, retry_after=7) == 7
    assert backoff.compute(0, retry_after=70) == 10
    jittered = Backoff(1.0, 10.0)
    assert all(4 <= jittered.compute(2) <= 4.4 for _ in range(100))


def test_bad_limits_name_their_setting() -> None:
    from scrapy.settings import Settings

    with pytest.raises(ConfigError, match="METEORSEED_SITE_RATE"):
        SiteLimits.from_settings(Settings({"METEORSEED_SITE_RATE": "fast"}))
    with pytest.raises(ConfigError, match="METEORSEED_SITE_CONCURRENCY"):
        SiteLimits.from_settings(Settings({"METEORSEED_SITE_CONCURRENCY": 0}))
    with pytest.raises(ConfigError, match="METEORSEED_BACKOFF_MAX"):
        Backoff(10.0, 1.0)


def test_retry_after_header_forms() -> None:
    assert parse_retry_after(b"3") == 3.0
    assert parse_retry_after("  12 ") == 12.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past

"""A gate or breaker error for one site stays that site's: its tasks wait, the error is logged
once, every other site keeps its permits (real Redis, one site's keys corrupted)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
import redis
from redis.exceptions import ResponseError
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector

from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.permits import PermitDesk
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.politeness.site_errors import SiteFaults
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
from meteorseed_scrapy.testing.clients import run_with_client as run
from tests.test_redis_full import full

T = TypeVar("T")
OPEN = SiteLimits(rate=1000.0, burst=1000, concurrency=100)
LOGGER = "meteorseed_scrapy.politeness.site_errors"
FULL_LOGGER = "meteorseed_scrapy.queue.plumbing.redis_full"




def new_stats() -> MemoryStatsCollector:
    return MemoryStatsCollector(SimpleNamespace(settings=Settings()))


def desk_on(client: Any, ns: str) -> PermitDesk:
    gate = SiteGate(client, KeyLayout(ns), lambda _site: OPEN, "c1", Backoff(1.0, 300.0))
    return PermitDesk(gate, new_stats())


def corrupt(sync_redis: redis.Redis, ns: str, site: str, what: str) -> None:
    """Give the site's ``what`` key the wrong type for what gate.lua does with it."""
    key = KeyLayout(ns).site(site, what)
    sync_redis.delete(key)
    if what in ("bucket", "leases", "breaker"):  # a hash or a zset there: make it a string
        sync_redis.set(key, "corrupt")
    else:  # a string there: make it a hash
        sync_redis.hset(key, "corrupt", "1")


async def flush_now(breaker: Breaker) -> None:
    """Flush ``breaker`` at once (it paces itself four times a second), asking Redis for every
    site, as after each one's backoff."""
    breaker._next_flush = 0.0
    breaker.faults._retry_at.clear()
    await breaker.flush()


def error_records(caplog: pytest.LogCaptureFixture, site: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR
            and f"site {site} " in r.getMessage()]


@pytest.mark.parametrize("what", ["bucket", "leases", "tighten", "breaker"])
def test_a_corrupt_key_of_one_site_leaves_the_others_their_permits(
    redis_url: str, namespace: str, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture,
    what: str
) -> None:
    corrupt(sync_redis, namespace, "bad", what)

    async def scenario(client: Any) -> tuple[list[int], list[bool], int]:
        desk = desk_on(client, namespace)
        granted, bad_waits = [], []
        for _ in range(5):
            desk.retry_at.clear()  # ask the gate every time, as after each backoff
            # The failing site comes first: before, nothing after it got a permit.
            waits = await desk.refill({"bad": 2, "good": 2}, 10)
            granted.append(desk.held("good"))
            bad_waits.append(waits.get("bad", 0) > 0 and not desk.held("bad"))
            desk.give_back_all()
            await desk.flush()
        return granted, bad_waits, desk.stats.get_value("meteorseed/gate/bad/errors")

    with caplog.at_level(logging.DEBUG, LOGGER):
        granted, bad_waits, errors = run(redis_url, scenario)
    assert granted == [2] * 5
    assert all(bad_waits)
    assert errors >= 5
    (logged,) = error_records(caplog, "bad")  # once, not per call
    assert "gate" in logged.getMessage()


def test_a_site_whose_state_is_repaired_gets_permits_again(
    redis_url: str, namespace: str, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    corrupt(sync_redis, namespace, "bad", "bucket")

    async def scenario(client: Any) -> tuple[int, float, int]:
        desk = desk_on(client, namespace)
        first = await desk.refill({"bad": 3}, 10)
        sync_redis.delete(KeyLayout(namespace).site("bad", "bucket"))
        blocked = desk.retry_at["bad"]  # its tasks wait out the backoff, not a busy loop
        desk.retry_at.clear()
        await desk.refill({"bad": 3}, 10)
        return len(first) and desk.held("bad"), blocked, len(desk.faults.failing())

    with caplog.at_level(logging.INFO, LOGGER):
        held, blocked, failing = run(redis_url, scenario)
    assert held == 3 and blocked > 0 and failing == 0
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.ERROR,
                                                                        logging.WARNING]


def test_release_and_renew_go_on_past_a_site_with_corrupt_leases(
    redis_url: str, namespace: str, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    keys = KeyLayout(namespace)

    async def scenario(client: Any) -> tuple[int, int]:
        desk = desk_on(client, namespace)
        await desk.refill({"bad": 2, "good": 2}, 10)
        taken = {site: desk.take(site) for site in ("bad", "good", "bad", "good")}
        corrupt(sync_redis, namespace, "bad", "leases")
        await desk.flush()  # renews every lease in hand: bad's refused, good's renewed
        for lease in taken.values():
            desk.done(lease)
        desk.give_back_all()
        await desk.flush()  # gives them back: bad's refused, good's gone
        return len(desk.to_release), await client.zcard(keys.site("good", "leases"))

    with caplog.at_level(logging.DEBUG, LOGGER):
        left, good_leases = run(redis_url, scenario)
    assert left == 0 and good_leases == 0  # nothing stuck in the queue, nothing leaked
    assert len(error_records(caplog, "bad")) == 1


def test_a_corrupt_breaker_state_spares_the_other_sites_breakers(
    redis_url: str, namespace: str, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.site("bad", "breaker"), mapping={"state": "ramp", "step": "x",
                                                           "since": "0"})

    async def scenario(client: Any) -> tuple[int, list[Any]]:
        breaker = Breaker(client, keys, BreakerConfig(), new_stats())
        for _ in range(3):
            for site in ("bad", "good"):
                breaker.record(site, False, 0.01, False)
            await flush_now(breaker)
        health = await client.hgetall(keys.site("good", "health"))
        return sum(int(v) for k, v in health.items() if k.endswith(":n")), breaker._pending["bad"]

    with caplog.at_level(logging.DEBUG, LOGGER):
        good_requests, bad_pending = run(redis_url, scenario)
    assert good_requests == 3  # every flush reached the good site
    assert bad_pending[0] == 3  # the bad site's counts wait for its next try, none lost
    (logged,) = error_records(caplog, "bad")
    assert "breaker" in logged.getMessage()


def test_a_full_redis_is_no_site_error_and_its_sites_are_tried_again_soon(
    redis_url: str, namespace: str, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Redis above its maxmemory refuses every site's breaker call alike: not a site's corrupt
    # state (an ERROR per site, backoff up to a minute) but a short wait, as room can come back
    # at any time, and one warning for the spell from the worker's one RedisFull, whichever
    # kinds of call it refused (here the breaker's and a pause call). A call that goes through
    # meanwhile does not end the spell (it may only have deleted): the worker's loops say when.
    keys = KeyLayout(namespace)
    sites = ("a", "b", "c")

    async def scenario(client: Any) -> tuple[list[float], dict[str, int], dict[str, Any]]:
        stats = new_stats()
        shared = RedisFull(stats)
        breaker = Breaker(client, keys, BreakerConfig(), stats, full=shared)
        pauses = SiteFaults("pause", stats, shared)
        waits = []
        with full(sync_redis):
            for _ in range(3):
                for site in sites:
                    breaker.record(site, False, 0.01, False)
                await flush_now(breaker)
                waits += [breaker.faults.blocked(site) for site in sites]
            try:
                await client.set(keys.site("a", "pause"), "1")
            except ResponseError as exc:
                waits.append(pauses.failed("a", exc))
            pauses.ok("b")  # (a pause call that went through, Redis still full)
        await flush_now(breaker)
        assert shared.refused == {"breaker calls", "pause calls"} and shared.failures == 10
        counted = {}
        for site in sites:
            health = await client.hgetall(keys.site(site, "health"))
            counted[site] = sum(int(v) for k, v in health.items() if k.endswith(":n"))
        return waits, counted, stats.get_stats()

    with caplog.at_level(logging.DEBUG):
        waits, counted, stats = run(redis_url, scenario)
    assert len(waits) == 10 and all(0 < wait <= RedisFull.MAX_DELAY_S for wait in waits), waits
    assert counted == dict.fromkeys(sites, 3)  # room again: every count kept gets through
    assert stats["meteorseed/redis/full"] == 10
    assert not [name for name in stats if name.startswith(("meteorseed/breaker/",
                                                           "meteorseed/pause/"))], stats
    said = [(r.levelno, r.getMessage()) for r in caplog.records
            if r.name in (LOGGER, FULL_LOGGER) and r.levelno >= logging.WARNING]
    assert [level for level, _ in said] == [logging.WARNING], said
    assert "full (above its maxmemory) during breaker calls" in said[0][1], said

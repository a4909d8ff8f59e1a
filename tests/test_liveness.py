"""Dead-worker detection (queue/fleet/liveness.py, lua/takeover.lua): a worker listed in the
live-worker
registry whose liveness lapsed has its pending tasks taken at once by another, exactly once
among racing survivors; a live one (its keep-alive thread beating, whatever the reactor does) is
never judged dead; a consumer never listed still waits for CLAIM_IDLE (real Redis)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delivery import Delivery, Ref
from meteorseed_scrapy.queue.consume.group import ConsumerGroup
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.liveness import (
    Heartbeat,
    Liveness,
    beat_interval,
    check_interval,
    liveness_ttl,
)
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client, sync_client
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client
from meteorseed_scrapy.testing.cluster import LocalCluster
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from meteorseed_scrapy.worker import keepalive
from meteorseed_scrapy.worker.keepalive import KeepAlive
from tests.e2e_helpers import enqueue, start_worker, stored_docs
from tests.test_shards import sites_covering

CLAIM_IDLE = 0.5  # seconds, for the keep-alive threads of the unit tests
NAMES = (b"dead", b"live", b"survivor")  # the workers of the property test


def task(n: int, site: str = "news") -> ExecTask:
    return ExecTask.create(seed_id="s1", site_id=site, url=f"https://{site}.example/p/{n}")


def held_by(redis_url: str, keys: KeyLayout, consumer: str, tasks: list[ExecTask]) -> set[Ref]:
    """Put ``tasks`` on the streams and have ``consumer`` read them all (pending on it)."""
    async def body(client: Any) -> set[Ref]:
        await TaskWriter(client, keys).add(tasks, dedup=False)
        c = StreamConsumer(client, keys, consumer)
        await c.ensure_group()
        got = await c.read(len(tasks), 0)
        assert len(got) == len(tasks)
        return {d.ref for d in got}

    return set(run_with_client(redis_url, body))


def owners(r: redis.Redis, keys: KeyLayout) -> dict[Ref, str]:
    """(stream, message id) -> the consumer it is pending on, over every task stream."""
    out: dict[Ref, str] = {}
    for stream in keys.streams:
        out.update({(stream, p["message_id"]): p["consumer"] for p in
                    r.xpending_range(stream, GROUP, "-", "+", 10_000)})
    return out


def listed(r: redis.Redis, keys: KeyLayout) -> set[str]:
    return {str(c["name"]) for stream in keys.streams
            for c in r.xinfo_consumers(stream, GROUP)}


def beat(r: redis.Redis, keys: KeyLayout, consumer: str, ttl_s: float) -> None:
    assert Heartbeat(r, keys, consumer).beat(ttl_s)


def lapse(r: redis.Redis, keys: KeyLayout, consumer: str) -> None:
    """What a SIGKILL leads to once its TTL is over: its deadline in the past."""
    r.zadd(keys.workers, {consumer: 1})


def take_over(redis_url: str, keys: KeyLayout, consumer: str, count: int = 100
              ) -> tuple[list[Delivery], list[bytes]]:
    """One survivor's take-over, as Intake.take_over does it: who is dead, take, settle."""
    async def body(client: Any) -> tuple[list[Delivery], list[bytes]]:
        live = Liveness(client, keys, consumer, CLAIM_IDLE)
        dead = await live.dead()
        if not dead:
            return [], []
        got, holding = await StreamConsumer(client, keys, consumer).reclaim_from(dead, count)
        await live.settle(dead, holding)
        return got, dead

    result: tuple[list[Delivery], list[bytes]] = run_with_client(redis_url, body)
    return result


def take_over_in_rounds(redis_url: str, keys: KeyLayout, count: int,
                        claim_idle: float = CLAIM_IDLE) -> list[list[Ref]]:
    """A survivor taking ``count`` at a time while anyone is dead (the known dead are taken
    from again without a registry check): the refs taken, round by round."""
    async def body(client: Any) -> list[list[Ref]]:
        live = Liveness(client, keys, "survivor", claim_idle)
        consumer = StreamConsumer(client, keys, "survivor")
        rounds = []
        while dead := await live.dead():
            assert dead == [b"dead"]
            got, holding = await consumer.reclaim_from(dead, count)
            await live.settle(dead, holding)
            rounds.append([d.ref for d in got])
        return rounds

    result: list[list[Ref]] = run_with_client(redis_url, body)
    return result


# -- the verdict -------------------------------------------------------------------------------

def test_intervals_derive_from_claim_idle_and_the_default_stays_ten_seconds() -> None:
    assert DEFAULTS["METEORSEED_CLAIM_IDLE"] == 10
    assert (beat_interval(10), liveness_ttl(10), check_interval(10)) == (1.0, 5.0, 1.0)
    # five renewals per TTL: four may fail in a row before a live worker is judged dead
    assert liveness_ttl(0.5) / beat_interval(0.5) == 5
    assert check_interval(600) == 1.0


@pytest.mark.parametrize("shards", [1, 3])
def test_a_dead_workers_tasks_are_taken_at_once_counted_and_it_is_forgotten(
        redis_url: str, namespace: str, sync_redis: redis.Redis, shards: int) -> None:
    keys = KeyLayout(namespace, shards)
    tasks = [task(n, site) for n, site in enumerate(sites_covering(shards) * 3)]
    ids = held_by(redis_url, keys, "dead", tasks)
    held_by(redis_url, keys, "survivor", [task(99)])
    beat(sync_redis, keys, "dead", 3600)
    beat(sync_redis, keys, "survivor", 3600)
    # Alive: nothing is taken, however fresh or old its entries.
    assert take_over(redis_url, keys, "survivor") == ([], [])
    lapse(sync_redis, keys, "dead")
    got, dead = take_over(redis_url, keys, "survivor")
    assert dead == [b"dead"]
    # Every entry at once (idle for a few ms only), each counted as a second delivery, whole.
    assert {d.ref for d in got} == ids
    assert {d.deliveries for d in got} == {2}
    assert sorted(d.task.task_id for d in got if d.task) == sorted(t.task_id for t in tasks)
    assert set(owners(sync_redis, keys).values()) == {"survivor"}
    # Cleaned up: off the registry and out of the group (it held nothing any more).
    assert sync_redis.zscore(keys.workers, "dead") is None
    assert "dead" not in listed(sync_redis, keys)
    assert sync_redis.zscore(keys.workers, "survivor") is not None


def test_a_dead_worker_holding_more_than_asked_is_worked_through_then_forgotten(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    ids = held_by(redis_url, keys, "dead", [task(n) for n in range(7)])
    beat(sync_redis, keys, "dead", 3600)
    lapse(sync_redis, keys, "dead")
    rounds = take_over_in_rounds(redis_url, keys, 3)
    assert [len(r) for r in rounds] == [3, 3, 1]
    assert {m for r in rounds for m in r} == ids
    assert sync_redis.zscore(keys.workers, "dead") is None


def test_two_survivors_racing_get_disjoint_entries(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace, 2)
    tasks = [task(n, site) for n, site in enumerate(sites_covering(2) * 40)]
    ids = held_by(redis_url, keys, "dead", tasks)
    beat(sync_redis, keys, "dead", 3600)
    lapse(sync_redis, keys, "dead")

    async def survivor(name: str) -> list[Ref]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            live = Liveness(client, keys, name, CLAIM_IDLE)
            consumer = StreamConsumer(client, keys, name)
            mine: list[Ref] = []
            while dead := await live.dead():
                got, holding = await consumer.reclaim_from(dead, 7)
                await live.settle(dead, holding)
                mine += [d.ref for d in got]
            return mine
        finally:
            await client.aclose()

    async def race() -> list[list[Ref]]:
        return list(await asyncio.gather(survivor("a"), survivor("b"), survivor("c")))

    got = asyncio.run(race())
    assert sorted(m for mine in got for m in mine) == sorted(ids)  # each exactly once
    taken = owners(sync_redis, keys)
    for name, mine in zip("abc", got, strict=True):
        assert all(taken[m] == name for m in mine)
    assert sync_redis.zscore(keys.workers, "dead") is None


def test_a_consumer_never_registered_still_waits_for_claim_idle(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    """An older worker or another tool: not judged by the registry, whatever it holds."""
    keys = KeyLayout(namespace)
    ids = held_by(redis_url, keys, "old-version", [task(n) for n in range(3)])
    beat(sync_redis, keys, "survivor", 3600)
    assert take_over(redis_url, keys, "survivor") == ([], [])
    assert set(owners(sync_redis, keys).values()) == {"old-version"}

    async def reclaim(client: Any) -> list[Delivery]:
        return await StreamConsumer(client, keys, "survivor").reclaim(0.05, 10)

    # After CLAIM_IDLE (50 ms here) it is reclaimed as before.
    got = wait_for(lambda: run_with_client(redis_url, reclaim), 30, 0.05)
    assert {d.ref for d in got} == ids


def test_a_survivor_whose_own_liveness_lapsed_judges_nobody(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    """Its own beats are late (or Redis's clock jumped): its view of the others is not
    trusted, so a live worker's tasks are not taken on a stale verdict."""
    keys = KeyLayout(namespace)
    held_by(redis_url, keys, "other", [task(1)])
    beat(sync_redis, keys, "other", 3600)
    lapse(sync_redis, keys, "other")
    lapse(sync_redis, keys, "late")
    assert take_over(redis_url, keys, "late") == ([], [])
    beat(sync_redis, keys, "late", 3600)
    assert take_over(redis_url, keys, "late")[1] == [b"other"]


def test_a_worker_that_came_back_is_not_forgotten(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    beat(sync_redis, keys, "w", 3600)

    async def body(client: Any) -> None:
        await Liveness(client, keys, "survivor").settle([b"w"], set())

    run_with_client(redis_url, body)  # judged dead a moment ago, alive again now: stays listed
    assert sync_redis.zscore(keys.workers, "w") is not None


# -- the live worker's side ----------------------------------------------------------------------

def _keeper(redis_url: str, keys: KeyLayout, consumer: str) -> KeepAlive:
    keeper = KeepAlive(StreamConsumer(redis.Redis.from_url(redis_url), keys, consumer),
                       redis_url, CLAIM_IDLE)
    keeper.start()
    return keeper


def test_a_beating_worker_is_never_judged_dead_while_no_event_loop_runs(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    """Its keep-alive thread beats whatever the reactor does (here: no event loop at all, as
    while a callback blocks it), over many TTLs; its tasks stay its own."""
    keys = KeyLayout(namespace)
    ids = held_by(redis_url, keys, "slow", [task(n) for n in range(3)])
    keeper = _keeper(redis_url, keys, "slow")
    try:
        wait_for(lambda: keeper.beats >= 1, 30, 0.01)
        assert sync_redis.zscore(keys.workers, "slow") is not None  # registered at once
        checks = 0
        while keeper.beats < 5 * liveness_ttl(CLAIM_IDLE) / beat_interval(CLAIM_IDLE):
            assert take_over(redis_url, keys, "survivor") == ([], [])
            checks += 1
        assert checks > 1
    finally:
        keeper.stop()
    assert set(owners(sync_redis, keys).values()) == {"slow"}
    assert set(owners(sync_redis, keys)) == ids


def test_a_stuck_reactor_stops_the_beats_and_its_tasks_go(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot not renewed for STALE_S: the worker is as good as dead."""
    monkeypatch.setattr(keepalive, "STALE_S", 0.3)
    keys = KeyLayout(namespace)
    ids = held_by(redis_url, keys, "stuck", [task(n) for n in range(2)])
    keeper = _keeper(redis_url, keys, "stuck")
    try:
        wait_for(lambda: keeper.beats >= 1, 30, 0.01)
        got = wait_for(lambda: take_over(redis_url, keys, "survivor")[0], 30, 0.05)
    finally:
        keeper.stop()
    assert {d.ref for d in got} == ids
    assert sync_redis.zscore(keys.workers, "stuck") is None


def test_a_clean_stop_leaves_the_registry_and_what_it_still_holds_goes_at_once(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    claim_idle = 600.0  # (beats of 300 s: what the stop's last beat gives is told apart)
    keeper = KeepAlive(StreamConsumer(redis.Redis.from_url(redis_url), keys, "quitter"),
                       redis_url, claim_idle)
    keeper.start()
    held_by(redis_url, keys, "holder", [task(1)])
    beat(sync_redis, keys, "holder", 3600)
    try:
        wait_for(lambda: keeper.beats >= 1, 30, 0.01)
    finally:
        keeper.stop()
    # The stop's last beat keeps it alive for CLAIM_IDLE, while it flushes and hands back.
    seconds, micros = sync_redis.time()
    left_s = (float(sync_redis.zscore(keys.workers, "quitter") or 0)
              - (seconds * 1000 + micros // 1000)) / 1000
    assert liveness_ttl(claim_idle) < left_s <= claim_idle

    async def leave(client: Any) -> tuple[int, int]:
        return (await ConsumerGroup(client, keys, "quitter").leave(),
                await ConsumerGroup(client, keys, "holder").leave())

    run_with_client(redis_url, leave)
    assert sync_redis.zscore(keys.workers, "quitter") is None  # held nothing: off the list
    # "holder" could not hand its task back: marked dead, taken at once, then forgotten.
    got, dead = take_over(redis_url, keys, "survivor")
    assert dead == [b"holder"] and len(got) == 1
    assert sync_redis.zrange(keys.workers, 0, -1) == []


# -- adversarial: the registry is shared state anyone can write ----------------------------------

def test_garbage_in_the_registry_is_survived_and_cleaned(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    ids = held_by(redis_url, keys, "dead", [task(1)])
    raw = redis.Redis.from_url(redis_url)
    garbage = [b"\xff\xfe not utf-8", b"", b"{braces} and spaces", b"x" * 5000, b"-", b"+"]
    raw.zadd(keys.workers, {name: 0 for name in garbage})
    beat(sync_redis, keys, "survivor", 3600)
    raw.zadd(keys.workers, {b"dead": float("-inf"), b"immortal": float("inf")})
    for _ in range(5):  # (at most MAX_DEAD a check: worked through)
        got, _ = take_over(redis_url, keys, "survivor")
        if {d.ref for d in got} == ids:
            break
    else:
        pytest.fail("the dead worker's task was never taken")
    wait_for(lambda: take_over(redis_url, keys, "survivor") == ([], []), 10, 0.01)
    # Only the one with a future deadline, and the asker itself, stay listed.
    assert sorted(raw.zrange(keys.workers, 0, -1)) == [b"immortal", b"survivor"]
    assert set(owners(sync_redis, keys).values()) == {"survivor"}


def test_a_registry_key_of_the_wrong_type_falls_back_to_claim_idle(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    keys = KeyLayout(namespace)
    held_by(redis_url, keys, "w", [task(1)])
    sync_redis.set(keys.workers, "not a zset")
    assert not Heartbeat(sync_redis, keys, "w").beat(60)  # left alone, not listed

    async def body(client: Any) -> tuple[list[bytes], list[bytes]]:
        live = Liveness(client, keys, "survivor", CLAIM_IDLE)
        first = await live.dead()
        live._next_check = 0.0  # (a second check: warned once only)
        second = await live.dead()
        await ConsumerGroup(client, keys, "w").leave()  # does not raise
        return first, second

    with caplog.at_level(logging.WARNING, logger="meteorseed_scrapy.queue.fleet.liveness"):
        assert run_with_client(redis_url, body) == ([], [])
    assert sum("not a live-worker registry" in r.message for r in caplog.records) == 1
    assert sync_redis.get(keys.workers) == "not a zset"
    assert set(owners(sync_redis, keys).values()) == {"w"}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.binary(max_size=200).filter(lambda b: b not in NAMES),
                       st.floats(allow_nan=False), max_size=40))
def test_any_registry_content_takes_the_dead_workers_tasks_and_only_theirs(
        redis_url: str, registry: dict[bytes, float]) -> None:
    keys = KeyLayout(f"h{uuid.uuid4().hex[:12]}")
    raw = redis.Redis.from_url(redis_url)
    try:
        dead = held_by(redis_url, keys, "dead", [task(1)])
        live = held_by(redis_url, keys, "live", [task(2)])
        if registry:
            raw.zadd(keys.workers, registry)
        raw.zadd(keys.workers, {b"dead": 1, b"live": 2 ** 52, b"survivor": 2 ** 52})
        for _ in range(len(registry) // 16 + 3):  # (MAX_DEAD a check)
            take_over(redis_url, keys, "survivor")
        with redis.Redis.from_url(redis_url, decode_responses=True) as text:
            taken = owners(text, keys)
        assert {ref: taken[ref] for ref in dead | live} == {
            **{ref: "survivor" for ref in dead}, **{ref: "live" for ref in live}}
        assert raw.zscore(keys.workers, b"dead") is None
        seconds, micros = raw.time()
        now_ms = seconds * 1000 + micros // 1000
        # Every name long dead is gone (a name with nothing pending: dropped at once).
        assert all(score > now_ms - 60_000
                   for _, score in raw.zrange(keys.workers, 0, -1, withscores=True))
    finally:
        raw.delete(*raw.keys(f"{keys.namespace}:*") or [keys.workers])
        raw.close()


def test_a_dead_workers_tasks_in_every_shard_are_taken_on_a_cluster(
        cluster: LocalCluster) -> None:
    """Shards on several nodes: the take-over runs per shard (one slot each), the registry's
    scripts on its one key."""
    keys = KeyLayout(f"c{uuid.uuid4().hex[:12]}", 3, cluster=True)
    tasks = [task(n, site) for n, site in enumerate(sites_covering(3) * 2)]
    beater = sync_client(cluster.url, decode_responses=True)

    async def scenario() -> tuple[set[Ref], list[Delivery], list[bytes], set[str]]:
        client = async_client(cluster.url, decode_responses=True)
        try:
            await TaskWriter(client, keys).add(tasks, dedup=False)
            dead = StreamConsumer(client, keys, "dead")
            await dead.ensure_group()
            held = {d.ref for d in await dead.read(len(tasks), 0)}
            beat(beater, keys, "dead", 3600)
            beat(beater, keys, "survivor", 3600)
            live = Liveness(client, keys, "survivor", CLAIM_IDLE)
            assert await live.dead() == []
            lapse(beater, keys, "dead")
            live._next_check = 0.0  # (the next check now)
            gone = await live.dead()
            got, holding = await StreamConsumer(client, keys, "survivor").reclaim_from(gone,
                                                                                       100)
            await live.settle(gone, holding)
            left = set(await client.zrange(keys.workers, 0, -1))
            return held, got, gone, left
        finally:
            await client.aclose()

    try:
        held, got, gone, left = asyncio.run(scenario())
    finally:
        beater.close()
    assert len(held) == len(tasks) and gone == [b"dead"]
    assert {d.ref for d in got} == held and {d.deliveries for d in got} == {2}
    assert {keys.shard_of_stream(d.stream).index for d in got} == {0, 1, 2}
    assert left == {"survivor"}


# -- real workers --------------------------------------------------------------------------------

@pytest.mark.e2e
def test_a_killed_worker_is_taken_over_by_its_liveness_not_claim_idle(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    """CLAIM_IDLE is an hour here, so only the dead-worker path can move the killed worker's
    tasks; its liveness lapsing (a TTL of half an hour) is simulated once it is dead."""
    keys = KeyLayout(namespace)
    settings: dict[str, Any] = {"METEORSEED_CLAIM_IDLE": 3600, "CONCURRENT_REQUESTS": 4,
                "METEORSEED_SITE_CONCURRENCY": 100, "METEORSEED_IDLE_CLOSE": 3}
    with DemoSite() as site:
        tasks = enqueue(redis_url, namespace, [f"{site.url}/slow/300?i={i}" for i in range(30)])
        victim = start_worker(tmp_path, redis_url, namespace, name="victim", **settings)

        def victim_holds() -> int:
            return int(owners_count(sync_redis, keys).get("victim", 0))

        wait_for(lambda: victim_holds() > 0 and sync_redis.zscore(keys.workers, "victim"),
                 60, 0.02)
        victim.kill()
        held = victim_holds()
        lapse(sync_redis, keys, "victim")
        other = start_worker(tmp_path, redis_url, namespace, name="other", **settings)
        assert other.wait(120) == 0, other.log()[-3000:]
    docs = stored_docs(tmp_path / "items.db")
    assert sorted(d["task_id"] for d in docs.values()) == sorted(t.task_id for t in tasks)
    assert sync_redis.xlen(keys.stream) == 0 and sync_redis.xlen(keys.dead) == 0
    stats = other.stats()
    assert stats.get("meteorseed/reclaimed/dead_worker", 0) >= held > 0
    assert sync_redis.zrange(keys.workers, 0, -1) == []  # victim forgotten, other left
    assert "victim" not in listed(sync_redis, keys)


def owners_count(r: redis.Redis, keys: KeyLayout) -> dict[str, int]:
    try:
        summary: Any = r.xpending(keys.stream, GROUP)
    except redis.ResponseError:  # no group yet
        return {}
    return {c["name"]: int(c["pending"]) for c in summary.get("consumers") or []}

"""The one queue reader (queue/inspect/status.py) against a real Redis: lanes and bands, consumers,
dead
letters, delayed tasks by site and reason, throughput counters, the idle check; the delayed-set
reason encoding (queue/fleet/delayed.py, lua/defer.lua) with hostile entries."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.group import quiet_plan
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.delayed import (
    REASON_CODES,
    SCALE,
    UNKNOWN,
    DelayedEntry,
    reason_of,
    site_of,
)
from meteorseed_scrapy.queue.fleet.snapshot import QueueStatus, summarize_delayed
from meteorseed_scrapy.queue.inspect.status import (
    QueueSampler,
    Throughput,
    read_status,
    status_plan,
)
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.reads import run_async
from meteorseed_scrapy.task.exceptions import DeferReason, TaskDeferred
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker
from tests.queue_helpers import ack

T = TypeVar("T")




def task(site: str, n: int, lane: str = "scheduled", priority: int = 0) -> ExecTask:
    return ExecTask.create(seed_id="s", site_id=site, url=f"https://{site}.test/{n}", lane=lane,
                           priority=priority)


def gate_for(client: Any, keys: KeyLayout) -> DelayedSet:
    return DelayedSet(client, keys)


async def defer_some(client: Any, keys: KeyLayout, deferrals: list[tuple[ExecTask, float,
                                                                          DeferReason]]) -> None:
    """Enqueue, deliver and defer each task (as a worker would) with its delay and reason."""
    await TaskWriter(client, keys).add([t for t, _, _ in deferrals])
    consumer = StreamConsumer(client, keys, "w1")
    await consumer.ensure_group()
    delivered = {d.task.task_id: d for d in await consumer.read(100, 0) if d.task}
    gate = gate_for(client, keys)
    for t, delay, why in deferrals:
        assert await gate.defer(delivered[t.task_id].ref, t, delay, "", why)


def test_snapshot_counts_every_lane_band_consumer_dead_and_delayed_task(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    deferred = [(task("news", 1), 60.0, DeferReason.RETRY), (task("news", 2), 90.0,
                                                              DeferReason.RETRY),
                (task("news", 3), 30.0, DeferReason.PAUSED), (task("shop", 1), 5.0,
                                                               DeferReason.SICK)]

    async def scenario(client: Any) -> QueueStatus:
        await defer_some(client, keys, deferred)
        await TaskWriter(client, keys).add([task("news", 10, "realtime", 1),
                                            task("news", 11), task("news", 12)])
        consumer = StreamConsumer(client, keys, "w2")
        await consumer.read(1, 0)  # the realtime one: pending on w2
        await client.xadd(keys.dead, {"t": "{}", "reason": "boom"})
        return await QueueSampler(redis_url, keys, client=client).sample()

    status = run(redis_url, scenario)
    assert (status.backlog, status.pending, status.length, status.dead) == (2, 1, 3, 1)
    assert status.lanes["realtime"].bands["high"].pending == 1
    assert status.lanes["scheduled"].bands["normal"].backlog == 2
    assert [(c.name, c.pending) for c in status.consumers] == [("w1", 0), ("w2", 1)]
    assert all(c.last_seen_at <= status.at and c.idle_s >= 0 for c in status.consumers)
    # Seven tasks were added to the streams; four were deferred, three are there: none is
    # settled for good yet.
    assert (status.added, status.finished) == (7, 0)

    delayed = status.delayed
    assert (delayed.total, delayed.scanned) == (4, 4)
    assert delayed.reasons == {"retry": 2, "paused": 1, "sick": 1}
    news, shop = delayed.sites
    assert (news.site_id, news.count, news.reasons) == ("news", 3, {"retry": 2, "paused": 1})
    assert (shop.site_id, shop.count, shop.reasons) == ("shop", 1, {"sick": 1})
    assert delayed.next_due_at == shop.next_due_at
    assert news.next_due_at is not None and shop.next_due_at is not None
    assert 0 < shop.next_due_at - status.at <= 5 and news.next_due_at - status.at > 5

    body = status.to_json()
    assert body["delayed"]["total"] == 4 and body["delayed"]["reasons"]["retry"] == 2
    assert body["delayed"]["sites"][0]["site_id"] == "news"
    assert 0 < body["delayed"]["next_due_in_s"] <= 5
    assert body["throughput"] == {"added_total": 7, "finished_total": 0}
    json.dumps(body, allow_nan=False)  # strict JSON: no NaN/Infinity for the console

    # The CLI's synchronous client reads the same snapshot (taken later: "in how long" differs).
    def when(delayed: dict[str, Any]) -> dict[str, Any]:
        return {**delayed, "next_due_in_s": None,
                "sites": [{**site, "next_due_in_s": None} for site in delayed["sites"]]}

    again = read_status(sync_redis, keys)
    assert when(again.to_json()["delayed"]) == when(body["delayed"])


def test_a_reason_is_the_score_fraction_and_the_member_is_unchanged(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = task("news", 1, "realtime", 1)
    run(redis_url, lambda c: defer_some(c, keys, [(one, 10.0, DeferReason.PRIORITY)]))
    [(member, score)] = sync_redis.zrange(keys.delayed, 0, -1, withscores=True)
    # Every version's promote.lua reads this member: the route, a bar, the task's message.
    assert member == f"realtime:high|{one.to_message()['t']}"
    assert score - math.floor(score) == REASON_CODES[DeferReason.PRIORITY] / SCALE
    assert reason_of(score) == "priority"

    # Due: promoted into its lane's stream and counted as added.
    sync_redis.zadd(keys.delayed, {member: math.floor(score) - 10_000 + 0.25})
    assert run(redis_url, lambda c: gate_for(c, keys).promote()) == -1
    [(_, fields)] = sync_redis.xrange(keys.task_stream("realtime", "high"))
    assert ExecTask.from_message(fields) == one
    assert sync_redis.hget(keys.only.counts, "added") == "2"


def test_entries_without_a_reason_or_a_task_are_unknown_or_damaged(
        sync_redis: redis.Redis, namespace: str) -> None:
    keys = KeyLayout(namespace)
    legacy = task("old", 1).to_message()["t"]
    sync_redis.zadd(keys.delayed, {
        legacy: 1_000,  # bare JSON, integer score: deferred before lanes and reasons
        f"scheduled:normal|{task('old', 2).to_message()['t']}": 2_000.5,  # not k/16
        "retry:normal|not json": 3_000 + 1 / SCALE,
        "retry:normal|" + "[" * 50_000: 4_000,  # nesting deeper than json can parse
        "retry:normal|{\"site_id\": \"a b\"}": 5_000,  # not a valid site id
        "+inf:never|{\"site_id\": \"late\"}": math.inf,
    })
    status = read_status(sync_redis, keys)
    delayed = status.delayed
    assert delayed.total == delayed.scanned == 6
    assert delayed.reasons == {UNKNOWN: 5, "retry": 1}
    assert {s.site_id: s.count for s in delayed.sites} == {None: 3, "old": 2, "late": 1}
    late = next(s for s in delayed.sites if s.site_id == "late")
    assert late.next_due_at is None  # never due: said so, not a huge number
    assert delayed.next_due_at == 1.0
    body = status.to_json()
    json.dumps(body, allow_nan=False)
    assert body["delayed"]["next_due_in_s"] < 0  # overdue: no worker promotes them


def test_the_breakdown_reads_the_soonest_entries_only(sync_redis: redis.Redis,
                                                     namespace: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.zadd(keys.delayed, {
        json.dumps({"site_id": f"s{i}", "n": i}): 1_000 * i - 1 + 1 / SCALE
        for i in range(1, 31)})
    delayed = read_status(sync_redis, keys, delayed_scan=10).delayed
    assert (delayed.total, delayed.scanned) == (30, 10)
    assert [s.site_id for s in delayed.sites] == [f"s{i}" for i in range(1, 11)]
    assert delayed.next_due_at == 1.0


def test_throughput_works_without_entries_added(redis_url: str, namespace: str,
                                                sync_redis: redis.Redis) -> None:
    """Redis 6.2's XINFO STREAM has no entries-added: the scripts' counter stands in."""
    keys = KeyLayout(namespace)
    run(redis_url, lambda c: TaskWriter(c, keys).add([task("news", i) for i in range(5)]))
    status = read_status(sync_redis, keys)
    assert (status.added, status.length, status.finished) == (5, 5, 0)
    clock = iter([100.0, 110.0, 130.0])
    meter = Throughput(window_s=60.0, clock=lambda: next(clock))
    first = meter.update(status)
    assert first["added_total"] == 5 and first["added_per_s"] is None

    async def ack_two(client: Any) -> None:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await ack(consumer, [d.ref for d in await consumer.read(2, 0)])
        await TaskWriter(client, keys).add([task("news", 9)])

    run(redis_url, ack_two)
    second = meter.update(read_status(sync_redis, keys))
    assert second == {"added_per_s": 0.1, "finished_per_s": 0.2, "over_s": 10.0,
                      "added_total": 6, "finished_total": 2}
    # A reset namespace: the counter starts again, and so do the rates.
    sync_redis.delete(keys.only.counts, *keys.streams)
    third = meter.update(read_status(sync_redis, keys))
    assert third["added_total"] == 0 and third["added_per_s"] is None


def test_a_task_re_parked_again_and_again_is_added_once_and_finished_once(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    """A site's quota re-parks a task (deferred, promoted back, read again) many times: the
    rates count new tasks and tasks settled for good, not the trips through the delayed set."""
    keys = KeyLayout(namespace)
    one = task("news", 1)
    run(redis_url, lambda c: TaskWriter(c, keys).add([one]))
    clock = iter(float(t) for t in range(100, 200, 2))
    meter = Throughput(window_s=60.0, clock=lambda: next(clock))
    meter.update(read_status(sync_redis, keys))

    async def re_park(client: Any) -> None:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        gate = gate_for(client, keys)
        for _ in range(10):
            [delivery] = await consumer.read(1, 0)
            assert await gate.defer(delivery.ref, one, 0.0, "", DeferReason.QUOTA)
            await gate.promote()  # due at once (delay 0): back in its stream
            assert await client.zcard(keys.delayed) == 0

    run(redis_url, re_park)
    status = read_status(sync_redis, keys)
    assert (status.added, status.length, status.finished) == (1, 1, 0)
    rates = meter.update(status)
    assert rates["added_per_s"] == 0 and rates["finished_per_s"] == 0

    async def ack_it(client: Any) -> None:
        consumer = StreamConsumer(client, keys, "w1")
        await ack(consumer, [d.ref for d in await consumer.read(1, 0)])

    run(redis_url, ack_it)
    status = read_status(sync_redis, keys)
    assert (status.added, status.length, status.finished) == (1, 0, 1)
    assert meter.update(status)["finished_per_s"] == 0.25  # 1 task over the 4 s since


def test_rates_never_span_more_than_the_window() -> None:
    """A console polled once in a while: no rate over 769 s where the last minute is meant."""
    def snapshot(added: int) -> QueueStatus:
        return QueueStatus(namespace="n", stream="n:tasks", at=0.0, lanes={}, shards=(),
                           consumers=(), delayed=summarize_delayed(0, []), dead=0,
                           added=added, lag_s=0.0)

    clock = iter([0.0, 769.0, 779.0])
    meter = Throughput(window_s=60.0, clock=lambda: next(clock))
    meter.update(snapshot(0))
    late = meter.update(snapshot(7690))
    assert late["added_per_s"] is None and late["over_s"] == 0.0
    soon = meter.update(snapshot(7700))
    assert soon["added_per_s"] == 1.0 and soon["over_s"] == 10.0


def test_an_unreadable_counter_leaves_throughput_unknown(sync_redis: redis.Redis,
                                                         namespace: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.only.counts, "added", "lots")
    status = read_status(sync_redis, keys)
    assert status.added is None and status.finished is None
    assert Throughput().update(status)["added_per_s"] is None


def test_quiet_only_when_nothing_waits_is_pending_or_delayed(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    def quiet() -> bool:
        return run(redis_url, lambda c: run_async(c, quiet_plan(keys)))

    assert quiet()
    run(redis_url, lambda c: defer_some(c, keys, [(task("news", 1), 60.0,
                                                   DeferReason.RETRY)]))
    assert sync_redis.xlen(keys.stream) == 0
    assert not quiet()  # only a delayed task left: the crawl is not finished
    sync_redis.delete(keys.delayed)
    assert quiet()


def test_sharded_layout_sums_every_shard(redis_url: str, namespace: str,
                                         sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace, shards=4)
    sites = [f"site{i}" for i in range(12)]

    async def scenario(client: Any) -> QueueStatus:
        await defer_some(client, keys, [(task(s, 1), 30.0, DeferReason.QUOTA) for s in sites])
        await TaskWriter(client, keys).add([task(s, 2) for s in sites])
        return await run_async(client, status_plan(keys, delayed_scan=8))

    status = run(redis_url, scenario)
    assert (status.backlog, status.added, status.finished) == (12, 24, 0)  # 12 parked
    assert status.delayed.total == 12 and sum(s.delayed for s in status.shards) == 12
    assert 8 <= status.delayed.scanned <= 12  # 2 per shard
    assert set(status.delayed.reasons) == {"quota"}
    assert [s.dead for s in status.shards] == [None] * 4  # one <ns>:dead on one Redis


def test_defer_refuses_a_bad_reason_code_before_any_write(
        sync_redis: redis.Redis, namespace: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    msg_id = sync_redis.xadd(keys.stream, task("news", 1).to_message())
    sync_redis.xreadgroup(keys.group, "w1", {keys.stream: ">"})
    defer = scripts.register(sync_redis, "defer")
    for bad in ("16", "-1", "1.5", "x"):
        with pytest.raises(ResponseError, match="reason code"):
            defer(keys=[keys.stream, keys.delayed], args=[keys.group, msg_id, 0, "m", "1", bad])
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 1
    assert sync_redis.zcard(keys.delayed) == 0


def test_task_deferred_says_why() -> None:
    assert TaskDeferred(1, "HTTP 503", count_retry=True).why is DeferReason.RETRY
    assert TaskDeferred(1, "x", count_retry=False).why is DeferReason.OTHER
    assert TaskDeferred(1, "HTTP 429", count_retry=False,
                        why=DeferReason.PAUSED).why is DeferReason.PAUSED


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_reason_of_any_score_is_a_reason_or_unknown(score: float) -> None:
    assert reason_of(score) in {*(r.value for r in DeferReason), UNKNOWN}


@given(st.integers(min_value=0, max_value=2 ** 48), st.sampled_from(list(DeferReason)))
def test_every_reason_survives_the_score(due_ms: int, why: DeferReason) -> None:
    score = due_ms - 1 + REASON_CODES[why] / SCALE  # as defer.lua writes it
    assert reason_of(float(repr(score))) == why.value  # as Redis prints it back
    assert DelayedEntry.parse("{}", score).due_at == due_ms / 1000
    assert math.ceil(score) == due_ms  # promote.lua moves it when it would move due_ms


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_site_of_any_member_is_a_valid_id_or_none(member: str | bytes) -> None:
    site = site_of(member)
    assert site is None or (site and not any(c.isspace() for c in site))


@given(st.text(min_size=1, max_size=50).filter(lambda s: not any(c.isspace() for c in s)),
       st.sampled_from(["", "retry:high|", "x|y|"]))
def test_site_of_finds_the_site_behind_any_route(site: str, route: str) -> None:
    member = route + json.dumps({"site_id": site, "url": "https://a.test/|"})
    assert site_of(member) == (site if route != "x|y|" else None)


@pytest.mark.e2e
def test_a_worker_records_why_it_deferred_each_task(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        demo_site: DemoSite) -> None:
    """A 503 waits as a retry, a 429 as a paused site: what ``meteorseed status`` reports."""
    keys = KeyLayout(namespace)
    enqueue(redis_url, namespace, [f"{demo_site.url}/flaky/{namespace}/1?code=503"])
    worker = start_worker(tmp_path, redis_url, namespace, name="w1", METEORSEED_IDLE_CLOSE=0,
                          METEORSEED_BACKOFF_BASE=120)
    try:
        wait_for(lambda: sync_redis.zcard(keys.delayed) == 1, 60, 0.05)
        enqueue(redis_url, namespace, [f"{demo_site.url}/status/429?retry_after=600&n={namespace}"])
        wait_for(lambda: sync_redis.zcard(keys.delayed) == 2, 60, 0.05)
    finally:
        worker.kill()
    status = read_status(sync_redis, keys)
    assert (status.backlog, status.pending, status.delayed.total) == (0, 0, 2)
    assert status.delayed.reasons == {"paused": 1, "retry": 1}
    (site,) = status.delayed.sites
    assert site.site_id == "probe" and site.count == 2
    assert site.next_due_at is not None and site.next_due_at - status.at > 60

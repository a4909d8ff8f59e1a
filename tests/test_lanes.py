"""Priority lanes and bands: routing, weighted reads, and every stream operation across lanes,
against a real Redis (no timing thresholds: shares are counted, not timed)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
import redis
from redis.asyncio import Redis
from scrapy import Request, Spider
from scrapy.settings import Settings

from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.permits import SiteQueues
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.delivery import Delivery
from meteorseed_scrapy.queue.consume.group import ConsumerGroup
from meteorseed_scrapy.queue.consume.lanes import LaneShares, LaneWeights
from meteorseed_scrapy.queue.enqueue.backlog import stream_counts
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.records import seed_to_dict
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.lanes import BANDS, LANES, band_of
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.testing.polling import wait_until
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.requests import request_to_task
from tests.queue_helpers import ack, touch
from tests.test_consumer import arun


def task(n: int, lane: str = "scheduled", priority: int = 0, site: str = "news") -> ExecTask:
    return ExecTask.create(seed_id="s", site_id=site, url=f"https://{site}.test/{lane}/{n}",
                           lane=lane, priority=priority)


@pytest.fixture
def keys(namespace: str) -> KeyLayout:
    return KeyLayout(namespace)


def lane_of(keys: KeyLayout, d: Delivery) -> str:
    return keys.stream_lanes[d.stream][0]


# -- keys, tasks, settings -------------------------------------------------------------------


def test_stream_set_keeps_the_old_stream_and_names_every_lane_and_band() -> None:
    keys = KeyLayout("ns")
    assert keys.task_stream("scheduled", "normal") == "ns:tasks" == keys.stream
    assert keys.task_stream("realtime", "high") == "ns:tasks:realtime:high"
    assert len(set(keys.streams)) == len(LANES) * len(BANDS)
    assert keys.streams[0] == "ns:tasks:realtime:high"  # read order: realtime first
    assert keys.stream_for("retry", -3) == "ns:tasks:retry:low"
    assert [band_of(p) for p in (5, 0, -1)] == ["high", "normal", "low"]
    with pytest.raises(ValueError, match="lane 'urgent'"):
        keys.task_stream("urgent", "high")


def test_lane_is_a_validated_task_field_left_out_of_messages_when_default() -> None:
    plain = task(1)
    assert "lane" not in plain.to_dict()
    realtime = task(2, "realtime")
    assert ExecTask.from_message(realtime.to_message()).lane == "realtime"
    with pytest.raises(TaskError, match="lane: must be one of realtime, scheduled, retry"):
        task(3, "urgent")
    seed = SeedTask.from_dict({"seed_id": "s", "site_id": "news", "task_type": "url_list",
                               "payload": {"urls": []}, "lane": "realtime"})
    made = seed.exec_task_factory()
    assert made is not None
    fast = made("https://news.test/a")
    assert fast.lane == "realtime" == seed.exec_task("https://news.test/a").lane
    assert ExecTask.from_message(fast.to_message()).lane == "realtime"
    with pytest.raises(TaskError, match="lane"):
        SeedTask(seed_id="s", site_id="n", task_type="url_list", payload={}, lane="x")


def test_the_seed_registry_keeps_a_seeds_lane() -> None:
    seed = SeedTask(seed_id="s", site_id="news", task_type="url_list", payload={"urls": []},
                    lane="realtime")
    assert SeedTask.from_dict(seed_to_dict(seed)) == seed
    assert "lane" not in seed_to_dict(SeedTask(seed_id="s", site_id="news",
                                               task_type="url_list", payload={}))


def test_children_inherit_their_parents_lane() -> None:
    spider = Spider("probe")
    parent = task(1, "realtime")
    child = request_to_task(Request("https://news.test/child"), spider, parent)
    assert child.lane == "realtime"
    assert request_to_task(Request("https://news.test/start"), spider, None).lane == "scheduled"


@pytest.mark.parametrize("raw, problem", [
    ("realtime:6,scheduled:3", "no weight for lane 'retry'"),
    ("realtime:6,scheduled:3,retry:x", "not an integer"),
    ("realtime:6,realtime:3,retry:1", "given twice"),
    ("urgent:1,realtime:6,scheduled:3,retry:1", "'urgent:1' is not <lane>:<weight>"),
    ("realtime:0,scheduled:0,retry:0", "not all 0"),
    ("realtime:-1,scheduled:3,retry:1", ">= 0"),
])
def test_lane_weights_setting_is_validated(raw: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        LaneWeights.from_settings(Settings({"METEORSEED_LANE_WEIGHTS": raw}))


def test_lane_weights_default_and_dict_form() -> None:
    assert str(LaneWeights.from_settings(Settings())) == "realtime:6,scheduled:3,retry:1"
    weights = LaneWeights.from_settings(
        Settings({"METEORSEED_LANE_WEIGHTS": {"retry": 2, "scheduled": 1, "realtime": 4}}))
    assert weights.weights == (4, 1, 2)


def test_shares_follow_the_weights_even_one_slot_at_a_time() -> None:
    shares = LaneShares(LaneWeights((6, 3, 1)))
    one_by_one = Counter()
    for _ in range(100):
        split = shares.split(1)
        one_by_one[LANES[split.index(1)]] += 1
    assert one_by_one == {"realtime": 60, "scheduled": 30, "retry": 10}
    assert shares.split(10) == [6, 3, 1]
    assert LaneShares(LaneWeights((1, 0, 1))).split(4) == [2, 0, 2]


# -- writing ---------------------------------------------------------------------------------


def test_writer_routes_each_task_to_its_lane_and_band(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    tasks = [task(1, "realtime"), task(2, "realtime", 5), task(3), task(4, "retry", -1),
             task(5, "scheduled", -2)]

    async def body(client: Redis) -> tuple[int, int]:
        writer = TaskWriter(client, keys)
        result = await writer.add(tasks)
        forced = await TaskWriter(client, keys, lane="realtime").add([task(6)])
        return result.enqueued, forced.enqueued

    assert arun(redis_url, body) == (5, 1)
    where = {s: [ExecTask.from_message(f).url for _, f in sync_redis.xrange(s)]
             for s in keys.streams if sync_redis.exists(s)}
    assert where == {
        keys.task_stream("realtime", "normal"): [tasks[0].url, task(6).url],
        keys.task_stream("realtime", "high"): [tasks[1].url],
        keys.stream: [tasks[2].url],
        keys.task_stream("retry", "low"): [tasks[3].url],
        keys.task_stream("scheduled", "low"): [tasks[4].url],
    }
    [(_, fields)] = sync_redis.xrange(keys.task_stream("realtime", "normal"), count=2)[1:]
    assert ExecTask.from_message(fields).lane == "realtime"  # --lane rewrote the task itself
    with pytest.raises(ValueError, match="lane must be one of"):
        TaskWriter(sync_redis, keys, lane="urgent")  # type: ignore[arg-type]


def test_dedup_spans_lanes(redis_url: str, keys: KeyLayout) -> None:
    async def body(client: Redis) -> tuple[int, int]:
        writer = TaskWriter(client, keys)
        first = await writer.add([task(1, "scheduled")])
        again = ExecTask.create(seed_id="s", site_id="news", url=task(1).url, lane="realtime")
        return first.enqueued, (await writer.add([again])).duplicates

    assert arun(redis_url, body) == (1, 1)


def test_backlog_counts_every_stream(redis_url: str, keys: KeyLayout) -> None:
    async def body(client: Redis) -> list[int]:
        writer = TaskWriter(client, keys)
        await writer.add([task(i, lane, p) for i in range(3) for lane in LANES for p in (1, 0)],
                         dedup=False)
        seen = [await writer.backlog()]
        consumer = StreamConsumer(client, keys, "c1")
        await consumer.ensure_group()
        got = await consumer.read(5, 0)
        seen.append(await writer.backlog())
        await ack(consumer, [d.ref for d in got])
        seen.append(await writer.backlog())
        counts = await stream_counts(client, keys)
        seen.append(sum(c.pending for c in counts.values()))
        return seen

    assert arun(redis_url, body) == [18, 13, 13, 0]


# -- reading ---------------------------------------------------------------------------------


def fill(redis_url: str, keys: KeyLayout, counts: dict[str, int]) -> None:
    async def body(client: Redis) -> None:
        await TaskWriter(client, keys).add(
            [task(i, lane) for lane, n in counts.items() for i in range(n)], dedup=False)

    arun(redis_url, body)


def read_lanes(redis_url: str, keys: KeyLayout, reads: int, count: int,
               weights: tuple[int, ...] = (6, 3, 1)) -> list[Counter[str]]:
    async def body(client: Redis) -> list[Counter[str]]:
        consumer = StreamConsumer(client, keys, "c1", LaneWeights(weights))
        await consumer.ensure_group()
        out = []
        for _ in range(reads):
            got = await consumer.read(count, 0)
            out.append(Counter(lane_of(keys, d) for d in got))
            await ack(consumer, [d.ref for d in got])
        return out

    return arun(redis_url, body)


def test_a_retry_storm_and_a_scheduled_backlog_do_not_starve_realtime(
    redis_url: str, keys: KeyLayout
) -> None:
    fill(redis_url, keys, {"scheduled": 2000, "retry": 2000, "realtime": 30})
    [first, *_] = reads = read_lanes(redis_url, keys, 10, 10)
    assert first == {"realtime": 6, "scheduled": 3, "retry": 1}
    # Realtime gets its 60 % until it is empty; what it leaves goes to the others 3:1.
    assert sum(r["realtime"] for r in reads) == 30
    assert reads[4]["realtime"] == 6 and reads[5]["realtime"] == 0
    assert reads[9] == {"scheduled": 8, "retry": 2}


def test_realtime_does_not_starve_the_others_one_task_at_a_time(
    redis_url: str, keys: KeyLayout
) -> None:
    fill(redis_url, keys, {"scheduled": 200, "retry": 200, "realtime": 200})
    total = sum(read_lanes(redis_url, keys, 100, 1), Counter())
    assert total == {"realtime": 60, "scheduled": 30, "retry": 10}


def test_unused_share_goes_to_the_other_lanes_by_weight(redis_url: str, keys: KeyLayout) -> None:
    fill(redis_url, keys, {"scheduled": 100, "retry": 100})
    assert read_lanes(redis_url, keys, 1, 20) == [{"scheduled": 15, "retry": 5}]


def test_a_lane_of_weight_zero_is_read_only_when_the_others_are_empty(
    redis_url: str, keys: KeyLayout
) -> None:
    fill(redis_url, keys, {"scheduled": 5, "retry": 50})
    reads = read_lanes(redis_url, keys, 2, 10, weights=(1, 1, 0))
    assert reads == [{"scheduled": 5, "retry": 5}, {"retry": 10}]


def test_bands_go_strictly_by_priority_within_a_lane(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    async def body(client: Redis) -> list[list[int]]:
        writer = TaskWriter(client, keys)
        await writer.add([task(i, "scheduled", p) for i, p in enumerate((-1, 0, 2, 0, -1, 1))])
        consumer = StreamConsumer(client, keys, "c1")
        await consumer.ensure_group()
        return [[d.task.priority for d in await consumer.read(n, 0) if d.task]
                for n in (1, 2, 3)]

    assert arun(redis_url, body) == [[2], [1, 0], [0, -1, -1]]


def test_an_idle_blocking_read_wakes_for_a_realtime_task(redis_url: str, keys: KeyLayout) -> None:
    async def body(client: Redis) -> list[str]:
        consumer = StreamConsumer(client, keys, "c1")
        await consumer.ensure_group()
        reading = asyncio.ensure_future(consumer.read(8, 10_000))

        async def blocked() -> bool:  # the script found nothing; XREAD BLOCK is waiting
            return any(c["cmd"] == "xread" and "b" in c["flags"]
                       for c in await client.client_list())

        await wait_until(blocked, 30, 0.01)
        assert not reading.done()
        await TaskWriter(client, keys).add([task(1, "realtime")])
        got = await asyncio.wait_for(reading, 9)
        return [lane_of(keys, d) for d in got]

    assert arun(redis_url, body) == ["realtime"]


# -- the rest of a task's life, across lanes -------------------------------------------------


def test_reclaim_touch_hand_back_ack_and_dead_letters_work_in_every_lane(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    tasks = [task(1, "realtime", 1), task(2), task(3, "retry", -1), task(4, "scheduled", 3)]

    async def body(client: Redis) -> dict[str, Any]:
        await TaskWriter(client, keys).add(tasks)
        a = StreamConsumer(client, keys, "a")
        b = StreamConsumer(client, keys, "b")
        await a.ensure_group()
        got = await a.read(10, 0)
        out: dict[str, Any] = {"read": [d.task.url for d in got if d.task]}
        out["touched"] = await touch(a, [d.ref for d in got])
        out["handed"] = await a.hand_back(got[:2], 3600)
        reclaimed = await b.reclaim(60, 10)
        out["reclaimed"] = [(d.stream, d.msg_id, d.deliveries) for d in reclaimed]
        out["lost"] = await touch(a, [d.ref for d in got])
        out["acked"] = await ack(b, [d.ref for d in reclaimed])
        out["dead"] = await a.dead_letter(got[2], "gave up")
        group = ConsumerGroup(client, keys, "a")
        out["quiet_before"] = await group.namespace_quiet()
        out["acked_last"] = await ack(a, [got[3].ref])
        out["quiet"] = await group.namespace_quiet()
        return out

    out = arun(redis_url, body)
    # Realtime first; within scheduled the high band (priority 3) before normal; retry last.
    assert out["read"] == [tasks[0].url, tasks[3].url, tasks[1].url, tasks[2].url]
    assert out["touched"] == [] and out["handed"] == 2
    assert [(s, d) for s, _, d in out["reclaimed"]] == [
        (keys.task_stream("realtime", "high"), 1), (keys.task_stream("scheduled", "high"), 1)]
    assert sorted(out["lost"]) == sorted((s, m) for s, m, _ in out["reclaimed"])
    assert out["acked"] == 2
    assert (out["quiet_before"], out["acked_last"], out["quiet"]) == (False, 1, True)
    assert sync_redis.xlen(keys.dead) == 1
    assert all(sync_redis.xlen(s) == 0 for s in keys.streams)
    assert all(sync_redis.xpending(s, keys.group)["pending"] == 0 for s in keys.streams)


def test_nogroup_on_any_stream_is_reported_and_ensure_group_repairs_it(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    async def body(client: Redis) -> list[str]:
        consumer = StreamConsumer(client, keys, "c1")
        await consumer.ensure_group()
        await client.delete(keys.task_stream("realtime", "low"))
        try:
            await consumer.read(4, 0)
        except redis.ResponseError as exc:
            assert "NOGROUP" in str(exc)
        else:
            raise AssertionError("a read over a stream without its group must fail")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([task(1, "realtime", -1)])
        return [d.stream for d in await consumer.read(4, 0)]

    assert arun(redis_url, body) == [keys.task_stream("realtime", "low")]


def make_gate(client: Redis, keys: KeyLayout) -> SiteGate:
    limits = SiteLimits(rate=1.0, burst=1, concurrency=1)
    return SiteGate(client, keys, lambda site: limits, "c1", Backoff(1.0, 10.0, 0.0))


def test_retries_go_to_the_retry_lane_and_pauses_back_to_their_own(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    retried, paused = task(1, "realtime", 2), task(2, "realtime")

    async def body(client: Redis) -> None:
        await TaskWriter(client, keys).add([retried, paused])
        consumer = StreamConsumer(client, keys, "c1")
        await consumer.ensure_group()
        by_url = {d.task.url: d for d in await consumer.read(2, 0) if d.task}
        gate = DelayedSet(client, keys)
        assert await gate.defer(by_url[retried.url].ref, retried, 0, "retry")
        assert await gate.defer(by_url[paused.url].ref, paused, 0)
        # A member written before lanes (bare JSON) goes to <ns>:tasks.
        legacy = task(3, "scheduled", 5)
        await client.zadd(keys.delayed, {legacy.to_message()["t"]: 0})
        assert await gate.promote() == -1

    arun(redis_url, body)
    where = {s: [ExecTask.from_message(f).url for _, f in sync_redis.xrange(s)]
             for s in keys.streams if sync_redis.xlen(s)}
    assert where == {keys.task_stream("retry", "high"): [retried.url],
                     keys.task_stream("realtime", "normal"): [paused.url],
                     keys.stream: [task(3).url]}
    assert sync_redis.zcard(keys.delayed) == 0
    promoted = ExecTask.from_message(sync_redis.xrange(keys.task_stream("retry", "high"))[0][1])
    assert promoted.lane == "realtime"  # its children stay realtime


def test_realtime_tasks_go_ahead_in_their_sites_local_queue() -> None:
    queue = SiteQueues()
    for item in ("s1", "s2"):
        queue.append("news", item)
    queue.append("news", "r1", urgent=True)
    queue.append("news", "r2", urgent=True)
    queue.append("news", "s3")
    assert queue.pop("news") == "r1"
    queue.append("news", "r3", urgent=True)  # behind r2, the urgent one still waiting
    assert list(queue) == ["r2", "r3", "s1", "s2", "s3"]
    assert queue.take_all("news") == ["r2", "r3", "s1", "s2", "s3"] and not queue
    queue.append("news", "s4")
    queue.append("news", "r4", urgent=True)  # take_all forgot the old urgent count
    assert [queue.pop("news"), queue.pop("news"), queue.pop("news")] == ["r4", "s4", None]

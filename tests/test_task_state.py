"""``meteorseed task`` / ``GET /tasks``'s reader (queue/inspect/task_state.py) against a real
Redis: a task
found by id and by URL while waiting, pending, delayed, done, dead and deduplicated; hostile
queries are refused naming the argument, never a crash."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.queue.consume.acks import Completion, TaskRecords
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.enqueue.dedup import fingerprint_bytes
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.inspect import task_state
from meteorseed_scrapy.queue.inspect.task_places import record_delivery, record_pending
from meteorseed_scrapy.queue.inspect.task_query import (
    TaskState,
    parse_query,
    query_for_id,
    query_for_url,
)
from meteorseed_scrapy.queue.inspect.task_state import task_state_plan
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client, sync_client
from meteorseed_scrapy.queue.plumbing.reads import run_async, run_sync
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.testing.cluster import LocalCluster
from tests.queue_helpers import ack

T = TypeVar("T")




def task(n: int, site: str = "news", **kwargs: Any) -> ExecTask:
    return ExecTask.create(seed_id="s", site_id=site, url=f"https://{site}.test/a/{n}", **kwargs)


def look(client: redis.Redis, keys: KeyLayout, text: str, site: str | None = None
         ) -> TaskState:
    return run_sync(client, task_state_plan(keys, parse_query(text, site=site)))


def test_waiting_and_pending_with_consumer_idle_and_deliveries(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    tasks = [task(i) for i in range(5)] + [task(9, lane="realtime", priority=2)]

    async def scenario(client: Any) -> None:
        await TaskWriter(client, keys, clock=lambda: 1000).add(tasks)
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await consumer.read(2, 0)  # the realtime one first, then the first scheduled one

    run(redis_url, scenario)
    third = look(sync_redis, keys, tasks[2].task_id)
    assert third.state == "waiting"
    [place] = third.places
    assert (place["lane"], place["band"], place["ahead"]) == ("scheduled", "normal", 1)
    assert place["stream"] == keys.stream and place["task"]["url"] == tasks[2].url
    assert third.exhaustive

    first = look(sync_redis, keys, tasks[0].task_id)
    assert first.state == "pending"
    [place] = first.places
    assert (place["consumer"], place["deliveries"]) == ("w1", 1) and place["idle_s"] >= 0
    realtime = look(sync_redis, keys, tasks[5].url)  # by URL, with its site from the entry
    assert realtime.state == "pending" and realtime.places[0]["lane"] == "realtime"
    assert realtime.places[0]["band"] == "high"
    # The site's dedup root has it: a seed re-enqueueing it is a duplicate, never re-crawled.
    assert realtime.dedup == [{"site_id": "news", "key": keys.seen("news"), "seen": True,
                               "window_s": 0, "seen_from": None, "eligible_at": None}]

    # Same answer through the asyncio client (the API's).
    again = run(redis_url, lambda c: run_async(c, task_state_plan(
        keys, query_for_id(tasks[0].task_id))))
    assert again.to_json()["places"][0]["consumer"] == "w1"


def test_delayed_until_when_and_why(redis_url: str, namespace: str,
                                    sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = task(1)

    async def scenario(client: Any) -> None:
        await TaskWriter(client, keys).add([one, task(2)])
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        [delivery] = await consumer.read(1, 0)
        gate = DelayedSet(client, keys)
        assert await gate.defer(delivery.ref, one, 120.0, "", DeferReason.PAUSED)

    run(redis_url, scenario)
    found = look(sync_redis, keys, one.task_id)
    assert found.state == "delayed"
    [place] = found.places
    assert place["why"] == "paused" and place["to_lane"] == "scheduled"
    assert 100 < place["due_at"] - found.at <= 121
    by_url = look(sync_redis, keys, one.url, site="news")
    assert by_url.state == "delayed" and by_url.places[0]["task"]["task_id"] == one.task_id


def test_done_record_and_dead_letter_reason(redis_url: str, namespace: str,
                                            sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    ok, bad = task(1), task(2)

    async def scenario(client: Any) -> None:
        await TaskWriter(client, keys).add([ok, bad])
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        deliveries = {d.task.task_id: d for d in await consumer.read(2, 0) if d.task}
        record = json.dumps({"outcome": "ok", "items": 3, "digest": "abc", "status": 200,
                             "at": 1.0})
        await consumer.complete([deliveries[ok.task_id].ref], 3600, done=[Completion(ok, record)])
        await TaskRecords(client, keys).note_failures([(bad, "callback raised KeyError")], 3600)
        await consumer.dead_letter(deliveries[bad.task_id], "HTTP 500 after 2 retries",
                                   fingerprint_bytes(bad).hex())

    run(redis_url, scenario)
    done = look(sync_redis, keys, ok.task_id)
    assert done.state == "done"
    assert done.places[0]["record"]["items"] == 3 and done.places[0]["record"]["digest"] == "abc"
    dead = look(sync_redis, keys, bad.task_id)
    assert dead.state == "dead"
    assert dead.places[0]["reason"] == "HTTP 500 after 2 retries"
    assert dead.places[0]["deliveries"] == 1 and dead.places[0]["consumer"] == "w1"
    assert dead.last_failure == "callback raised KeyError"
    # Dead-lettering releases the URL: not seen any more, a seed may enqueue it again.
    assert look(sync_redis, keys, bad.url).state == "dead"
    assert [d["seen"] for d in look(sync_redis, keys, bad.url).dedup] == [False]


def test_deduplicated_says_when_it_becomes_eligible_again(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    windowed = task(1, meta={"recrawl_after": 3600})

    async def scenario(client: Any) -> None:
        await TaskWriter(client, keys).add([windowed])
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        [delivery] = await consumer.read(1, 0)
        await ack(consumer, [delivery.ref])

    run(redis_url, scenario)
    # A URL typed in another (non-canonical) form finds the same fingerprint.
    found = look(sync_redis, keys, "https://news.test/a/1#top", site="news")
    assert found.state == "deduplicated" and not found.places
    [row] = found.dedup
    assert row["seen"] and row["window_s"] == 3600
    assert row["seen_from"] <= found.at < row["eligible_at"] <= found.at + 3600 + 1
    other = look(sync_redis, keys, "https://news.test/a/2", site="news")
    assert other.state == "not found" and other.dedup[0]["seen"] is False


def test_url_without_a_site_finds_the_registry_sites(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = task(1, site="shop")
    run(redis_url, lambda c: TaskWriter(c, keys).add([one]))
    sync_redis.xtrim(keys.stream, maxlen=0)  # gone from the stream, still in dedup
    assert look(sync_redis, keys, one.url).state == "not found"  # no site known
    sync_redis.zadd(keys.seeds_by_site, {"shop\tseed1": 0})
    assert look(sync_redis, keys, one.url).state == "deduplicated"


def test_scans_are_bounded_and_say_so(monkeypatch: pytest.MonkeyPatch, redis_url: str,
                                      namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    tasks = [task(i) for i in range(12)]
    run(redis_url, lambda c: TaskWriter(c, keys).add(tasks))
    monkeypatch.setattr(task_state, "WAITING_SCAN", 5)
    far = look(sync_redis, keys, tasks[-1].task_id)
    assert far.state == "not found" and not far.exhaustive
    [main] = [s for s in far.searched if s.where == keys.stream]
    assert (main.read, main.complete) == (5, False)
    near = look(sync_redis, keys, tasks[4].task_id)
    assert near.state == "waiting" and near.places[0]["ahead"] == 4


def test_damaged_entries_are_skipped_not_fatal(namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = task(1)
    sync_redis.xadd(keys.stream, {"v": "1", "t": "not json"})
    sync_redis.xadd(keys.stream, {"v": "1", "t": "[" * 10_000})
    sync_redis.xadd(keys.stream, one.to_message())
    sync_redis.zadd(keys.delayed, {"retry:normal|{bad": 1, one.task_id: 2})
    sync_redis.xadd(keys.dead, {"t": "{}", "reason": one.task_id})
    sync_redis.set(keys.done(one.task_id), "\xff not json")
    found = look(sync_redis, keys, one.task_id)
    assert {p["state"] for p in found.places} == {"waiting", "done"}
    [waiting] = [p for p in found.places if p["state"] == "waiting"]
    assert waiting["ahead"] == 2
    assert [p["record"] for p in found.places if p["state"] == "done"] == [
        {"damaged": "\xff not json"}]


def test_a_pending_place_gets_its_delivery_or_is_done_if_acked_meanwhile() -> None:
    state = TaskState(query_for_id("t1"), 0.0)
    keys = KeyLayout("ns")
    stream = keys.shard_keys[0].streams[0]
    one = record_pending(state, keys, stream, "1000-0", task(1))
    two = record_pending(state, keys, stream, "2000-0", task(2))
    record_delivery(state, one, [{"consumer": b"w1", "time_since_delivered": 1500,
                                  "times_delivered": 2}])
    record_delivery(state, two, [])  # XPENDING found nothing: acked between the two reads
    first, second = state.places
    assert (first["state"], first["consumer"], first["idle_s"], first["deliveries"]) == (
        "pending", "w1", 1.5, 2)
    assert second["state"] == "done" and second["note"] == "acked while being looked up"
    assert state.state == "pending"


@pytest.mark.parametrize("text, field", [
    ("", "URL|ID"), ("a b", "URL|ID"), ("x" * 201, "URL|ID"), ("ftp://x/y", "URL|ID"),
    ("https://", "URL|ID"), ("https:// x", "URL|ID"), ("\ud800", "URL|ID"),
])
def test_bad_queries_name_the_argument(text: str, field: str) -> None:
    with pytest.raises(TaskError) as info:
        parse_query(text)
    assert info.value.field == field


def test_bad_site_names_the_site() -> None:
    with pytest.raises(TaskError) as info:
        query_for_url("https://a.test/", site="a b")
    assert info.value.field == "site_id"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(st.text(), st.text().map(lambda t: "https://" + t),
                      st.text().map(lambda t: "http://a.test/" + t)))
def test_any_string_is_a_query_or_a_refusal_naming_it(text: str) -> None:
    try:
        query = parse_query(text)
    except TaskError as exc:
        assert exc.field == "URL|ID"
        return
    assert (query.task_id is None) != (query.url is None)
    json.dumps(query.to_json())


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(min_size=1, max_size=60),
                      st.text(max_size=40).map(lambda t: "https://a.test/" + t)))
def test_any_query_gets_an_answer_from_redis(sync_redis: redis.Redis, namespace: str,
                                            text: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.xadd(keys.stream, task(1).to_message())
    try:
        query = parse_query(text, site="news")
    except TaskError as exc:
        assert exc.field == "URL|ID"
        return
    answer = run_sync(sync_redis, task_state_plan(keys, query))
    json.dumps(answer.to_json(), allow_nan=False)
    assert answer.state in {"not found", "waiting"}


def _shard_scenario(url: str, keys: KeyLayout, tasks: list[ExecTask]) -> None:
    async def scenario(client: Any) -> None:
        await TaskWriter(client, keys).add(tasks)
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await consumer.read(1, 0)

    async def main() -> None:
        client = async_client(url, decode_responses=True)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_stream_shards_are_each_searched(redis_url: str, namespace: str,
                                         sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace, shards=4)
    tasks = [task(1, site=f"site{i}") for i in range(8)]
    _shard_scenario(redis_url, keys, tasks)
    states = [look(sync_redis, keys, t.task_id).state for t in tasks]
    assert sorted(states).count("waiting") >= 7 and set(states) <= {"waiting", "pending"}
    one = tasks[3]
    by_site = look(sync_redis, keys, one.url, site=one.site_id)
    assert by_site.state in ("waiting", "pending")
    assert {s.where for s in by_site.searched} >= set(keys.for_site(one.site_id).streams)
    assert by_site.dedup[0]["key"] == keys.seen(one.site_id) and by_site.dedup[0]["seen"]


@pytest.mark.e2e
def test_on_a_redis_cluster(cluster: LocalCluster, ns: str) -> None:
    keys = KeyLayout(ns, shards=3, cluster=True)
    tasks = [task(1, site=f"site{i}") for i in range(4)]
    _shard_scenario(cluster.url, keys, tasks)
    client = sync_client(cluster.url, decode_responses=True)
    try:
        for one in tasks:
            assert look(client, keys, one.task_id).state in ("waiting", "pending")
            found = look(client, keys, one.url, site=one.site_id)
            assert found.state in ("waiting", "pending") and found.dedup[0]["seen"]
    finally:
        client.close()


def test_a_delayed_task_by_id_also_gets_its_dedup_record(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = task(7)

    async def scenario(client: Any) -> None:
        await TaskWriter(client, keys).add([one])
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        [delivery] = await consumer.read(1, 0)
        gate = DelayedSet(client, keys)
        assert await gate.defer(delivery.ref, one, 30.0, "", DeferReason.RETRY)

    run(redis_url, scenario)
    found = look(sync_redis, keys, one.task_id)
    assert found.state == "delayed" and found.places[0]["why"] == "retry"
    assert [(d["site_id"], d["seen"]) for d in found.dedup] == [("news", True)]

"""A seed's progress counters, kept by the enqueue and settle scripts (real Redis): counts,
the finished state and its event, children, dead letters, deferrals, a new run, garbage seeds,
and a sharded layout (counters per shard summed, the end judged on read)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.deadletters import iter_dead, requeue
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.crawl_progress import Settle, read_progress, read_progress_sync
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout, shard_of
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.seeding.expand import expand_seeds
from meteorseed_scrapy.seeding.expand_types import ExpandOptions
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.testing.clients import run_with_client


def task(n: int, seed: str = "s1", site: str = "news") -> ExecTask:
    return ExecTask.create(seed_id=seed, site_id=site, url=f"https://{site}.example/p/{n}")


def events(sync_redis: redis.Redis, keys: KeyLayout) -> list[dict[str, str]]:
    return [fields for _, fields in sync_redis.xrange(keys.events)]


async def settle_all(consumer: StreamConsumer, items: int = 1) -> int:
    deliveries = await consumer.read(100, 0)
    return await consumer.complete(
        [d.ref for d in deliveries], 60,
        [Settle(d.task.seed_id, d.task.site_id, items, 0, 100) for d in deliveries if d.task])


def test_a_seed_counts_its_tasks_and_finishes_once_all_are_done(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    async def body(client: Any) -> dict[str, Any]:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        added = await TaskWriter(client, keys).add([task(i) for i in range(3)])
        assert added.enqueued == 3
        await TaskWriter(client, keys).add([task(0)])  # a duplicate: not counted
        running = (await read_progress(client, keys, ["s1"]))["s1"]
        assert running is not None
        assert (running["state"], running["enqueued"], running["waiting"]) == ("running", 3, 3)
        assert await settle_all(consumer, items=2) == 3
        return (await read_progress(client, keys, ["s1"]))["s1"] or {}

    done = run_with_client(redis_url, body)
    assert done["state"] == "finished"
    assert (done["enqueued"], done["done"], done["dead"], done["waiting"]) == (3, 3, 0, 0)
    assert (done["items"], done["bytes"]) == (6, 300)
    assert done["finished_at"] >= done["started_at"] > 0
    kinds = [e["event"] for e in events(sync_redis, keys)]
    assert kinds == ["started", "finished"]
    finished = events(sync_redis, keys)[1]
    assert finished["seed"] == "s1"
    assert json.loads(finished["counters"])["done"] == 3
    # Finished one-shot counters expire after the retention; the site has the same totals.
    assert 0 < sync_redis.ttl(keys.only.crawl("s1")) <= 7 * 86400
    site = sync_redis.hgetall(keys.only.crawl_site("news"))
    assert (site["enqueued"], site["done"], site["items"]) == ("3", "3", "6")


def test_children_keep_their_seed_running_until_they_settle(
        redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)

    async def body(client: Any) -> list[str]:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        writer = TaskWriter(client, keys)
        await writer.add([task(0)])
        [parent] = await consumer.read(10, 0)
        # The parent's children are durable before its ack (as a worker writes them).
        await writer.add([task(10), task(11)])
        states = []
        await consumer.complete([parent.ref], 60, [Settle("s1", "news", 1)])
        states.append((await read_progress(client, keys, ["s1"]))["s1"]["state"])  # type: ignore[index]
        await settle_all(consumer)
        progress = (await read_progress(client, keys, ["s1"]))["s1"]
        assert progress is not None and progress["done"] == 3
        states.append(progress["state"])
        return states

    assert run_with_client(redis_url, body) == ["running", "finished"]


def test_a_dead_lettered_task_counts_as_dead_and_ends_its_seed(
        redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)

    async def body(client: Any) -> dict[str, Any] | None:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([task(0), task(1)])
        first, second = await consumer.read(10, 0)
        await consumer.complete([first.ref], 60, [Settle("s1", "news", 1)])
        assert await consumer.dead_letter(second, "gone for good")
        return (await read_progress(client, keys, ["s1"]))["s1"]

    progress = run_with_client(redis_url, body)
    assert progress is not None
    assert (progress["state"], progress["done"], progress["dead"]) == ("finished", 1, 1)


def test_a_deferred_task_is_delayed_not_waiting_and_the_seed_is_not_finished(
        redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)

    async def body(client: Any) -> list[tuple[str, int, int]]:
        consumer = StreamConsumer(client, keys, "w1")
        gate = DelayedSet(client, keys)
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([task(0)])
        [delivery] = await consumer.read(10, 0)
        assert delivery.task is not None
        assert await gate.defer(delivery.ref, delivery.task, 0.0, owner="w1")
        seen = []
        progress = (await read_progress(client, keys, ["s1"]))["s1"] or {}
        seen.append((progress["state"], progress["delayed"], progress["waiting"]))
        await gate.promote()
        progress = (await read_progress(client, keys, ["s1"]))["s1"] or {}
        seen.append((progress["state"], progress["delayed"], progress["waiting"]))
        await settle_all(consumer)
        progress = (await read_progress(client, keys, ["s1"]))["s1"] or {}
        seen.append((progress["state"], progress["delayed"], progress["done"]))
        return seen

    assert run_with_client(redis_url, body) == [("running", 1, 0), ("running", 0, 1),
                                                ("finished", 0, 1)]


def test_a_finished_seed_enqueued_again_starts_a_new_run_keeping_the_last(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    async def body(client: Any) -> dict[str, Any] | None:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([task(0), task(1)])
        await settle_all(consumer)
        await TaskWriter(client, keys).add([task(2)])  # the next run (a schedule's)
        return (await read_progress(client, keys, ["s1"]))["s1"]

    progress = run_with_client(redis_url, body)
    assert progress is not None
    assert (progress["state"], progress["run"], progress["enqueued"]) == ("running", 2, 1)
    assert progress["previous"]["done"] == 2 and progress["previous"]["finished_at"]
    assert sync_redis.ttl(keys.only.crawl("s1")) == -1  # a running seed does not expire
    assert [e["event"] for e in events(sync_redis, keys)] == ["started", "finished", "started"]


def test_a_requeued_dead_letter_is_enqueued_again_for_its_seed(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    async def body(client: Any) -> None:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([task(0)])
        [delivery] = await consumer.read(10, 0)
        await consumer.dead_letter(delivery, "boom")

    run_with_client(redis_url, body)
    [letter] = list(iter_dead(sync_redis, keys))
    assert requeue(sync_redis, keys, [letter]).requeued
    progress = read_progress_sync(sync_redis, keys, ["s1"])["s1"]
    assert progress is not None
    assert (progress["state"], progress["run"], progress["enqueued"]) == ("running", 2, 1)
    assert progress["previous"]["dead"] == 1
    # The new run is told started (once; its end after it settles: test_seed_events_sharded)
    assert [e["event"] for e in events(sync_redis, keys)] == ["started", "finished", "started"]


NASTY_SEEDS = ["", " ", "a b", "x" * 201, "line\nbreak", "tab\tin", "\x00", "é" * 80,
               "{s0}", "a:b:c"]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.one_of(st.sampled_from(NASTY_SEEDS), st.text(max_size=300)),
       numbers=st.lists(st.one_of(st.sampled_from(["", "nan", "-5", "1e999", "inf", "9" * 40,
                                                   "0x10", " 1"]),
                                  st.text(max_size=8)), min_size=3, max_size=3))
def test_garbage_in_an_ack_never_fails_it(sync_redis: redis.Redis, namespace: str, seed: str,
                                          numbers: list[str]) -> None:
    # An ack with a seed_id or counts that are no such thing acks all the same (a Lua error
    # there would stall every ack); such an entry counts under no seed, its counts as 0.
    keys = KeyLayout(namespace)
    for key in sync_redis.scan_iter(f"{namespace}:*"):
        sync_redis.delete(key)
    sync_redis.xgroup_create(keys.stream, GROUP, "0", mkstream=True)
    msg_id = sync_redis.xadd(keys.stream, {"v": "1", "t": "{}"})
    sync_redis.xreadgroup(GROUP, "w1", {keys.stream: ">"})
    ack = sync_redis.register_script(scripts.script_source("ack"))
    acked, _ = ack(keys=[keys.stream], args=[GROUP, "w1", keys.events, "1.000", 60, 60, 10, 0,
                                             0, 0, msg_id, seed, seed, *numbers])
    assert acked == 1
    assert sync_redis.xlen(keys.stream) == 0
    # Lua's rule, on bytes: at most 200 of them, no ASCII space or control character (a
    # task's own check refuses more, e.g. Unicode spaces: these never reach the script).
    raw = seed.encode("utf-8", "surrogatepass")
    usable = 0 < len(raw) <= 200 and not any(b <= 32 or b == 127 for b in raw)
    counted = keys.only.crawl(seed if usable else "")
    assert sync_redis.hget(counted, "done") == "1"
    for name in ("items", "anomalies", "bytes"):
        value = sync_redis.hget(counted, name)
        assert value is None or int(value) >= 0


def test_an_undecodable_message_dead_letters_under_no_seed(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    async def body(client: Any) -> str:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await client.xadd(keys.stream, {"v": "1", "t": "not json"})
        [delivery] = await consumer.read(10, 0)
        assert delivery.task is None
        return await consumer.dead_letter(delivery, "undecodable")

    assert run_with_client(redis_url, body)
    assert sync_redis.hget(keys.only.crawl(""), "dead") == "1"


def _sites_in_two_shards(shards: int) -> tuple[str, str]:
    names = [f"site{i}" for i in range(50)]
    first = names[0]
    other = next(n for n in names if shard_of(n, shards) != shard_of(first, shards))
    return first, other


def test_a_sharded_seed_finishes_when_every_shard_is_done(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace, shards=2)
    a, b = _sites_in_two_shards(2)

    async def body(client: Any) -> list[str]:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([task(0, site=a), task(1, site=b)])
        first, second = await consumer.read(10, 0)
        states = []
        await consumer.complete([first.ref], 60, [Settle("s1", first.task.site_id, 1)])  # type: ignore[union-attr]
        states.append((await read_progress(client, keys, ["s1"]))["s1"]["state"])  # type: ignore[index]
        await consumer.complete([second.ref], 60, [Settle("s1", second.task.site_id, 1)])  # type: ignore[union-attr]
        progress = (await read_progress(client, keys, ["s1"]))["s1"]
        assert progress is not None and (progress["done"], progress["items"]) == (2, 2)
        states.append(progress["state"])
        return states

    assert run_with_client(redis_url, body) == ["running", "finished"]
    finished = [e for e in events(sync_redis, keys) if e["event"] == "finished"]
    assert len(finished) == 1 and json.loads(finished[0]["counters"])["done"] == 2


@pytest.mark.parametrize("urls", [5, 4, 2], ids=["last-batch-partial", "exact-batches",
                                                 "one-batch"])
def test_a_seed_crawled_faster_than_expanded_is_not_finished_between_its_batches(
        redis_url: str, namespace: str, sync_redis: redis.Redis, urls: int) -> None:
    # Every batch is crawled (settled) before the next one is written: without the engine's
    # hold the seed would count as finished after its first batch.
    keys = KeyLayout(namespace)
    states: list[str] = []

    class Crawled(TaskWriter):
        async def enqueue(self, encoded: Any, order: Any = None, holds: Any = None) -> Any:
            result = await super().enqueue(encoded, order, holds)
            await settle_all(consumer)
            states.append(((await read_progress(client, keys, ["big"]))["big"] or {})["state"])
            return result

    async def body(redis: Any) -> dict[str, Any] | None:
        nonlocal client, consumer
        client = redis
        consumer = StreamConsumer(redis, keys, "w1")
        await consumer.ensure_group()
        seeds = [(1, SeedTask.from_dict({
            "seed_id": "big", "site_id": "news", "task_type": "url_list",
            "payload": {"urls": [f"https://news.example/{i}" for i in range(urls)]}}))]
        await expand_seeds(seeds, Crawled(redis, keys), ExpandOptions(batch_size=2),
                           on_error=lambda r: None)
        return (await read_progress(redis, keys, ["big"]))["big"]

    client: Any = None
    consumer: Any = None
    progress = run_with_client(redis_url, body)
    assert progress is not None
    assert (progress["state"], progress["done"], progress["expanding"]) == ("finished", urls,
                                                                            False)
    assert [e["event"] for e in events(sync_redis, keys)] == ["started", "finished"], (
        events(sync_redis, keys), states)

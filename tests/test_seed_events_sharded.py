"""A seed's ``started`` and ``finished`` events on a sharded layout (STREAM_SHARDS > 1), where
the shard scripts cannot write the events stream: each told exactly once per run, however the
seed's tasks are spread over the shards and however many workers settle them at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.deadletters import iter_dead, requeue
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.crawl_progress import (
    Settle,
    finish_if_done,
    read_progress,
    tell_started,
    told_key,
)
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client
from meteorseed_scrapy.testing.cluster import LocalCluster

SHARDS = 4
T = TypeVar("T")


def task(seed: str, n: int) -> ExecTask:
    site = f"site{n % 12}"  # (12 sites: every shard of 4 gets some)
    return ExecTask.create(seed_id=seed, site_id=site, url=f"https://{site}.example/{seed}/{n}")


def told(sync_redis: redis.Redis, keys: KeyLayout) -> list[tuple[str, str]]:
    return [(f["event"], f["seed"]) for _i, f in sync_redis.xrange(keys.events)]


async def work(client: Any, keys: KeyLayout, name: str) -> int:
    """One worker: read and settle until nothing is left to read."""
    consumer = StreamConsumer(client, keys, name)
    settled = 0
    while deliveries := await consumer.read(7, 0):
        settled += await consumer.complete([d.ref for d in deliveries], 60, [
            Settle(d.task.seed_id, d.task.site_id, 1) for d in deliveries if d.task])
    return settled


def test_each_seed_is_told_started_and_finished_once_per_run_with_eight_workers(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace, shards=SHARDS)
    seeds = [f"s{k}" for k in range(6)]

    async def body(client: Any) -> list[int]:
        await StreamConsumer(client, keys, "w0").ensure_group()
        writers = [TaskWriter(client, keys) for _ in seeds]
        settled = []
        for run in range(2):  # a second run of every seed after the first finished
            # Each seed's tasks in several batches, written while eight workers settle them.
            async def write(writer: TaskWriter, seed: str, run: int = run) -> None:
                for batch in range(3):
                    await writer.add([task(seed, 100 * run + 10 * batch + i) for i in range(10)])

            await asyncio.gather(*(write(w, s) for w, s in zip(writers, seeds, strict=True)))
            settled.append(sum(await asyncio.gather(
                *(work(client, keys, f"w{i}") for i in range(8)))))
            progress = await read_progress(client, keys, seeds)
            assert all(p is not None and p["state"] == "finished" for p in progress.values())
        return settled

    assert run_with_client(redis_url, body) == [len(seeds) * 30] * 2
    events = told(sync_redis, keys)
    assert Counter(events) == Counter({(e, s): 2 for s in seeds for e in ("started", "finished")})
    for seed in seeds:  # started, finished, started, finished
        assert [e for e, s in events if s == seed] == ["started", "finished"] * 2


def test_two_workers_ending_a_seed_at_once_tell_it_once(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace, shards=SHARDS)

    async def body(client: Any) -> list[list[str]]:
        await StreamConsumer(client, keys, "w0").ensure_group()
        await TaskWriter(client, keys).add([task("s1", i) for i in range(12)])
        await work(client, keys, "w1")  # (it told finished; then two more look at once)
        sync_redis.set(told_key(keys, "s1"), "started")
        for key in (shard.crawl("s1") for shard in keys.shard_keys):
            sync_redis.hdel(key, "finished_at")
        return list(await asyncio.gather(*(finish_if_done(client, keys, ["s1"], 60)
                                           for _ in range(4))))

    answers = run_with_client(redis_url, body)
    assert sorted(map(len, answers)) == [0, 0, 0, 1]
    assert told(sync_redis, keys) == [("started", "s1"), ("finished", "s1"), ("finished", "s1")]


def test_a_seed_done_before_its_start_was_told_is_told_both_in_order(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace, shards=SHARDS)

    async def body(client: Any) -> list[str]:
        await StreamConsumer(client, keys, "w0").ensure_group()
        await TaskWriter(client, keys).add([task("s1", i) for i in range(5)])
        # As if the writer had not told it yet: its workers settle everything first.
        sync_redis.delete(keys.events, told_key(keys, "s1"))
        await work(client, keys, "w1")
        assert told(sync_redis, keys) == []  # the end is not told before the start
        return await tell_started(client, keys, ["s1"], 60)

    assert run_with_client(redis_url, body) == ["s1"]
    assert told(sync_redis, keys) == [("started", "s1"), ("finished", "s1")]
    progress = run_with_client(redis_url, lambda c: read_progress(c, keys, ["s1"]))["s1"]
    assert progress is not None and progress["state"] == "finished"


def test_a_seed_run_again_by_a_requeued_dead_letter_is_told_started_and_finished(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace, shards=SHARDS)

    async def die(client: Any) -> None:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([task("s1", 0)])
        [delivery] = await consumer.read(10, 0)
        await consumer.dead_letter(delivery, "boom")

    run_with_client(redis_url, die)
    assert told(sync_redis, keys) == [("started", "s1"), ("finished", "s1")]
    [letter] = list(iter_dead(sync_redis, keys))
    assert requeue(sync_redis, keys, [letter]).requeued
    assert run_with_client(redis_url, lambda c: work(c, keys, "w2")) == 1
    assert told(sync_redis, keys) == [("started", "s1"), ("finished", "s1")] * 2


def test_on_a_cluster_each_seed_is_told_started_and_finished_once(
        cluster: LocalCluster, ns: str) -> None:
    keys = KeyLayout(ns, shards=3, cluster=True)
    seeds = ["s1", "s2"]

    async def body(client: Any) -> list[tuple[str, str]]:
        await StreamConsumer(client, keys, "w0").ensure_group()
        for seed in seeds:
            await TaskWriter(client, keys).add([task(seed, i) for i in range(12)])
        assert sum(await asyncio.gather(*(work(client, keys, f"w{i}") for i in range(4)))) == 24
        return [(f["event"], f["seed"]) for _i, f in await client.xrange(keys.events)]

    got = run_cluster(cluster.url, body)
    assert Counter(got) == Counter({(e, s): 1 for s in seeds for e in ("started", "finished")})


def run_cluster(url: str, body: Callable[[Any], Awaitable[T]]) -> T:
    async def main() -> T:
        client = async_client(url, decode_responses=True)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())

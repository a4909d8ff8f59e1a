"""A Redis that can lose a worker's keys, seen while it runs (issue 22.4): the eviction policy
checked again and again (and at an OOM), a vanished stream or group reported as loss. Real
Redis (``CONFIG SET`` on the test server, restored after each test) and real `scrapy crawl`
workers where the outcome is an exit code."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delivery import Ref
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
from meteorseed_scrapy.testing.polling import wait_for, wait_until
from meteorseed_scrapy.testing.sites import DemoSite
from meteorseed_scrapy.worker.loops import Loops
from meteorseed_scrapy.worker.redis_watch import REASON, RedisWatch
from tests.e2e_helpers import enqueue, start_worker
from tests.test_redis_full import full

EVICTING = "Redis may evict this namespace's task streams"


@pytest.fixture
def eviction_config(sync_redis: redis.Redis) -> Iterator[redis.Redis]:
    """The test Redis, its maxmemory and maxmemory-policy put back after the test."""
    saved = {**sync_redis.config_get("maxmemory"), **sync_redis.config_get("maxmemory-policy")}
    try:
        yield sync_redis
    finally:
        for name, value in saved.items():
            sync_redis.config_set(name, value)


class Holder:
    def __init__(self, refs: list[Ref]) -> None:
        self.refs = list(refs)
        self.forgotten: list[Ref] = []

    def held_refs(self) -> list[Ref]:
        return list(self.refs)

    def lost(self, ref: Ref) -> None:
        self.forgotten.append(ref)
        self.refs.remove(ref)


def watch_once(redis_url: str, namespace: str, holder: Holder, call: str,
               exc: ResponseError | None = None) -> tuple[RedisWatch, object]:
    crawler = get_crawler()
    crawler.stats.open_spider()

    async def main() -> tuple[RedisWatch, object]:
        client = async_client(redis_url, decode_responses=True)
        try:
            watch = RedisWatch(crawler, StreamConsumer(client, KeyLayout(namespace), "w1"),
                               holder)
            result = await (watch.refused(exc) if exc is not None else getattr(watch, call)())
            return watch, result
        finally:
            await client.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_policy_that_evicts_any_key_under_a_maxmemory_stops_the_worker(
    eviction_config: redis.Redis, redis_url: str, namespace: str, policy: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    eviction_config.config_set("maxmemory", 512 * 1024 * 1024)
    eviction_config.config_set("maxmemory-policy", policy)
    watch, _ = watch_once(redis_url, namespace, Holder([]), "check")
    assert watch._stop.stopped
    assert watch.stats.get_value("meteorseed/redis/evicting") == 1
    assert f"maxmemory-policy is {policy!r}" in caplog.text and "noeviction" in caplog.text


@pytest.mark.parametrize(("policy", "maxmemory"), [
    ("volatile-lru", 512 * 1024 * 1024), ("allkeys-lru", 0), ("noeviction", 1024 * 1024)])
def test_policies_that_cannot_evict_a_task_stream_do_not_stop_it(
    eviction_config: redis.Redis, redis_url: str, namespace: str, policy: str, maxmemory: int,
) -> None:
    eviction_config.config_set("maxmemory", maxmemory)
    eviction_config.config_set("maxmemory-policy", policy)
    watch, _ = watch_once(redis_url, namespace, Holder([]), "check")
    assert not watch._stop.stopped


def refusal_of_a_full_redis(client: redis.Redis, namespace: str) -> ResponseError:
    """What redis-py raises for a write to a Redis above its maxmemory (an OutOfMemoryError,
    whose text has lost Redis's "OOM" code)."""
    with full(client), pytest.raises(ResponseError) as refused:
        client.set(f"{namespace}:x", 1)
    return refused.value


SCRIPT_OOM_62 = ("Error running script (call to f_4f78): @user_script:30: @user_script: 30:"
                 " -OOM command not allowed when used memory > 'maxmemory'.")


@pytest.mark.parametrize("form", ["redis-py's", "a script's on Redis 6.2"])
def test_an_oom_has_the_policy_checked_at_once(
    eviction_config: redis.Redis, redis_url: str, namespace: str, form: str
) -> None:
    oom = (refusal_of_a_full_redis(eviction_config, namespace) if form == "redis-py's"
           else ResponseError(SCRIPT_OOM_62))
    eviction_config.config_set("maxmemory", 512 * 1024 * 1024)
    eviction_config.config_set("maxmemory-policy", "allkeys-lru")
    watch, _ = watch_once(redis_url, namespace, Holder([]), "", oom)
    assert watch._stop.stopped


def pending_refs(client: redis.Redis, keys: KeyLayout, n: int) -> list[Ref]:
    client.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    for i in range(n):
        client.xadd(keys.stream, {"i": i})
    read = client.xreadgroup(keys.group, "w1", {keys.stream: ">"}, count=n)
    return [(keys.stream, msg_id) for _, entries in read for msg_id, _ in entries]


@pytest.mark.parametrize("how", ["stream deleted", "group destroyed", "group made again"])
def test_a_vanished_stream_or_group_is_reported_as_loss_with_its_count(
    redis_url: str, namespace: str, sync_redis: redis.Redis, how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = KeyLayout(namespace)
    refs = pending_refs(sync_redis, keys, 7)
    if how == "stream deleted":
        sync_redis.delete(keys.stream)
    else:
        sync_redis.xgroup_destroy(keys.stream, keys.group)
        if how == "group made again":  # (another worker saw it gone first)
            sync_redis.xgroup_create(keys.stream, keys.group, id="0")
    holder = Holder(refs)
    nogroup = ResponseError(f"NOGROUP No such key '{keys.stream}' or consumer group")
    watch, _ = watch_once(redis_url, namespace, holder, "", nogroup)
    if how == "group made again":  # the group is there: nothing to tell from a take-over
        assert holder.forgotten == []
        return
    assert sorted(holder.forgotten) == sorted(refs)
    assert watch.stats.get_value("meteorseed/redis/lost") == 7
    assert "Redis lost 7 task message(s)" in caplog.text
    assert "taken over" not in caplog.text


def test_loops_seeing_the_loss_at_once_report_it_once(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)
    holder = Holder(pending_refs(sync_redis, keys, 5))
    holder.lost = lambda ref: None  # type: ignore[method-assign]  # (started tasks stay held)
    sync_redis.delete(keys.stream)
    crawler = get_crawler()
    crawler.stats.open_spider()

    async def main() -> list[int]:
        client = async_client(redis_url, decode_responses=True)
        try:
            watch = RedisWatch(crawler, StreamConsumer(client, keys, "w1"), holder)
            return list(await asyncio.gather(*(watch.vanished() for _ in range(3))))
        finally:
            await client.aclose()

    assert sorted(asyncio.run(main())) == [0, 0, 5]
    assert crawler.stats.get_value("meteorseed/redis/lost") == 5


def test_entries_of_a_stream_still_there_are_not_lost(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)
    holder = Holder(pending_refs(sync_redis, keys, 3))
    watch, lost = watch_once(redis_url, namespace, holder, "vanished")
    assert lost == 0 and holder.forgotten == []
    assert watch.stats.get_value("meteorseed/redis/lost") is None


# -- real workers --------------------------------------------------------------------------------

def test_a_worker_stops_when_redis_is_switched_to_evict_any_key(
    tmp_path: Path, eviction_config: redis.Redis, redis_url: str, namespace: str,
    demo_site: DemoSite,
) -> None:
    keys = KeyLayout(namespace)
    enqueue(redis_url, namespace, [f"{demo_site.url}/shop/product/{i}" for i in range(1, 4)])
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_IDLE_CLOSE=0)
    wait_for(lambda: eviction_config.xlen(keys.stream) == 0, 60)  # running, done with those
    eviction_config.config_set("maxmemory", 512 * 1024 * 1024)
    eviction_config.config_set("maxmemory-policy", "allkeys-lru")
    enqueue(redis_url, namespace, [f"{demo_site.url}/slow/20000?{i}" for i in range(3)])
    code = worker.wait(60)
    log = worker.log()
    assert code == 1, log[-3000:]
    assert log.count(EVICTING) == 1
    assert worker.stats()["finish_reason"] == REASON
    assert eviction_config.xlen(keys.dead) == 0


@pytest.mark.parametrize("deleted", ["stream", "namespace"])
def test_a_stream_or_every_key_deleted_under_a_worker_is_lost_tasks_not_a_take_over(
    deleted: str, tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    demo_site: DemoSite,
) -> None:
    keys = KeyLayout(namespace)
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    hits_before = demo_site.hits("/slow/30000")  # (the site serves the whole session)
    enqueue(redis_url, namespace, [f"{demo_site.url}/slow/30000?{i}" for i in range(4)])
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_IDLE_CLOSE=0)
    # Each of them pending on the worker and downloading (a slow page): started, so each one's
    # end comes after its message is gone.
    wait_for(lambda: sync_redis.xpending(keys.stream, keys.group)["pending"] == 4, 60)
    wait_for(lambda: demo_site.hits("/slow/30000") == hits_before + 4, 60)
    if deleted == "stream":  # e.g. evicted, or a Redis restarted without persistence
        sync_redis.delete(keys.stream)
    else:  # FLUSHALL as far as this namespace goes (the shared test Redis holds other
        # tests' keys): streams, the group, the live-worker registry, heartbeats, dedup sets.
        sync_redis.delete(*sync_redis.scan_iter(f"{namespace}:*"))
    try:
        wait_for(lambda: "Redis lost" in worker.log() and sync_redis.exists(keys.stream), 60, 0.05)
    except AssertionError:
        raise AssertionError(worker.log()[-6000:]) from None
    worker.signal(signal.SIGINT)
    worker.wait(60)
    log = worker.log()
    assert log.count("Redis lost") == 1 and "Redis lost 4 task message(s)" in log, log[-3000:]
    assert "taken over by another worker" not in log
    stats = worker.stats()
    assert stats["meteorseed/redis/lost"] == 4
    # Their downloads ended after the loss (timed out at shutdown): nothing to write for them.
    assert "Error while enqueuing scrape" not in log, log[-3000:]
    assert stats["meteorseed/settled_unheld"] == 4


class SlowSetUp(StreamConsumer):
    """Counts its group set-ups, each held until ``go`` is set (a loaded machine)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.set_ups = 0
        self.go = asyncio.Event()

    async def ensure_group(self) -> None:
        self.set_ups += 1
        await self.go.wait()
        await super().ensure_group()


def test_the_loops_set_the_group_up_once_not_once_each(redis_url: str, namespace: str,
                                                       sync_redis: redis.Redis) -> None:
    """A loop whose set-up ended late re-created a group deleted meanwhile, silently: the
    worker's tasks there then looked taken over by another worker instead of lost."""
    crawler = get_crawler()
    crawler.stats.open_spider()
    keys = KeyLayout(namespace)
    steps: dict[str, int] = {}

    async def main() -> int:
        client = async_client(redis_url, decode_responses=True)
        consumer = SlowSetUp(client, keys, "w1")
        loops = Loops(consumer, crawler.stats, RedisFull(crawler.stats))
        try:
            for where in ("read", "reclaim", "ack", "idle check"):
                async def step(where: str = where) -> None:
                    steps[where] = steps.get(where, 0) + 1
                    await asyncio.sleep(0.01)
                loops.start(step, where)
            await wait_until(lambda: consumer.set_ups >= 1)
            consumer.go.set()
            await wait_until(lambda: len(steps) == 4)
            return consumer.set_ups
        finally:
            loops.stopping = True
            await loops.cancel()
            await client.aclose()

    assert asyncio.run(main()) == 1
    assert sync_redis.xinfo_groups(keys.stream)[0]["name"] == keys.group


def test_a_redis_that_cannot_be_asked_leaves_the_loop_running(namespace: str) -> None:
    """The hook runs inside a loop's error handling: its own trouble must not end the loop."""
    crawler = get_crawler()
    crawler.stats.open_spider()
    holder = Holder([(f"{namespace}:tasks", "1-0")])

    async def main() -> None:
        client = async_client("redis://127.0.0.1:1/0", decode_responses=True,
                              socket_connect_timeout=1)
        try:
            watch = RedisWatch(crawler, StreamConsumer(client, KeyLayout(namespace), "w1"),
                               holder)
            await watch.refused(ResponseError("NOGROUP No such key"))
            await watch.refused(ResponseError("OOM command not allowed"))
        finally:
            await client.aclose()

    asyncio.run(main())
    assert holder.forgotten == []

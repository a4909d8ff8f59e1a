"""The URL dedup (dedup_lib.lua) on a real Redis: windows, generations, splits, expiry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis

from meteorseed_scrapy.queue.enqueue.dedup import check_server_config, fingerprint_bytes
from meteorseed_scrapy.queue.enqueue.enqueue_calls import AddResult
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask

T = TypeVar("T")
DAY = 86400
# The start of a one-day generation, in the future: keys get EXPIREAT from this clock.
T0 = (int(time.time()) // DAY + 30) * DAY


def task(url: str, window: int | None = None, site: str = "s") -> ExecTask:
    meta: dict[str, Any] = {} if window is None else {"recrawl_after": window}
    return ExecTask.create(seed_id="seed", site_id=site, url=url, meta=meta)


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def run(redis_url: str, namespace: str, clock: Clock | None,
        body: Callable[[TaskWriter], Awaitable[T]]) -> T:
    async def main() -> T:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await body(TaskWriter(client, KeyLayout(namespace), clock=clock))
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_url_becomes_eligible_again_once_its_window_has_passed(
    redis_url: str, namespace: str
) -> None:
    clock = Clock(T0 + 100)
    url = "https://example.com/a"

    async def body(w: TaskWriter) -> list[AddResult]:
        out = [await w.add([task(url, DAY)])]
        clock.now = T0 + DAY + 50  # next generation, 23h58m later: still inside the window
        out.append(await w.add([task(url)]))  # a child request: the site's stored window
        clock.now = T0 + 100 + DAY + 30  # just past the window (rounded up to its time slot)
        out.append(await w.add([task(url)]))
        out.append(await w.add([task(url)]))  # recorded again, in the current generation
        return out

    assert run(redis_url, namespace, clock, body) == [
        AddResult(1, 0), AddResult(0, 1), AddResult(1, 0), AddResult(0, 1)
    ]


def test_without_a_window_a_url_is_never_enqueued_twice(redis_url: str, namespace: str) -> None:
    clock = Clock(T0)

    async def body(w: TaskWriter) -> list[AddResult]:
        out = [await w.add([task("https://example.com/a")])]
        clock.now = T0 + 3650 * DAY
        out.append(await w.add([task("https://example.com/a")]))
        return out

    assert run(redis_url, namespace, clock, body) == [AddResult(1, 0), AddResult(0, 1)]


def test_generation_keys_expire_after_two_windows(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    clock = Clock(T0 + 5)
    run(redis_url, namespace, clock,
        lambda w: w.add([task(f"https://example.com/{i}", DAY) for i in range(50)]))
    root = KeyLayout(namespace).seen("s")
    gen_keys = [k for k in sync_redis.scan_iter(f"{root}:*")]
    assert gen_keys, "nothing recorded"
    g = T0 // DAY
    for key in gen_keys:
        assert key.startswith(f"{root}:{DAY}:{g}")
        # EXPIRETIME is Redis 7 only; TTL + now works on 6.2 too (to the second it was read).
        expires_at = time.time() + sync_redis.ttl(key)
        assert abs(expires_at - ((g + 2) * DAY + 60)) <= 5, key
    assert sync_redis.ttl(root) == -1  # the root (the site's window) stays


def test_previous_generation_is_looked_up_exactly_without_a_bloom_filter(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    clock = Clock(T0 + 10)
    old = [f"https://example.com/old/{i}" for i in range(3000)]
    new = [f"https://example.com/new/{i}" for i in range(3000)]

    async def body(w: TaskWriter) -> list[AddResult]:
        out = [await w.add([task(u, DAY) for u in old])]
        clock.now = T0 + DAY + 10  # old URLs now in the previous generation, still live
        out.append(await w.add([task(u) for u in old + new]))
        return out

    # Every new URL got in, every old one was held back.
    assert run(redis_url, namespace, clock, body) == [AddResult(3000, 0), AddResult(3000, 3000)]
    root = KeyLayout(namespace).seen("s")
    g = T0 // DAY
    assert sync_redis.hgetall(f"{root}:{DAY}:{g - 1}") == {}  # (no generation before)
    assert set(sync_redis.hgetall(f"{root}:{DAY}:{g}")) == {"n", "b", "p", "q"}
    assert not list(sync_redis.scan_iter(f"{root}:*:f*"))  # no Bloom slices any more


def bucket_of(sync_redis: redis.Redis, gen: str, fp: bytes) -> str:
    """The bucket key of ``fp`` in generation ``gen`` (linear hashing, as dedup_lib.lua)."""
    state = sync_redis.hgetall(gen)
    level, split = 2 ** int(state["b"]), int(state["p"])
    h = int.from_bytes(fp[:3], "big")
    index = h % level if h % level >= split else h % (2 * level)
    return f"{gen}:{index}"


def test_every_bucket_keeps_its_expiry_after_splits_and_after_a_release_empties_it(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    # Past the first 4096 entries of a generation an insert no longer sets its bucket's
    # expiry: a bucket that a release emptied must still come back with one.
    clock = Clock(T0 + 10)
    tasks = [task(f"https://example.com/{i}", DAY) for i in range(6000)]
    root = KeyLayout(namespace).seen("s")
    gen = f"{root}:{DAY}:{T0 // DAY}"
    assert run(redis_url, namespace, clock, lambda w: w.add(tasks)) == AddResult(6000, 0)
    keys = list(sync_redis.scan_iter(f"{root}:*"))
    assert len(keys) > 100  # many splits happened
    assert all(sync_redis.ttl(k) > 0 for k in keys)
    by_bucket: dict[str, list[ExecTask]] = {}
    for t in tasks:
        by_bucket.setdefault(bucket_of(sync_redis, gen, fingerprint_bytes(t)), []).append(t)
    bucket, members = next(iter(by_bucket.items()))
    assert sync_redis.hlen(bucket) == len(members)

    # (one whose last fingerprint byte is not a multiple of 4: the old sampled re-arming
    # skipped it)
    back = next(t for t in members if fingerprint_bytes(t)[15] % 4)

    async def body(w: TaskWriter) -> tuple[list[bool], AddResult]:
        released = [await w.release(t) for t in members]
        return released, await w.add([task(back.url)])

    released, again = run(redis_url, namespace, clock, body)
    assert released == [True] * len(members) and again == AddResult(1, 0)
    assert sync_redis.ttl(bucket) > 0
    assert int(sync_redis.hget(gen, "n")) == 6000 - len(members) + 1


def test_buckets_split_and_stay_compact(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    n = 20_000
    result = run(redis_url, namespace, None,
                 lambda w: w.add([task(f"https://example.com/{i}") for i in range(n)]))
    assert result == AddResult(n, 0)
    gen = f"{KeyLayout(namespace).seen('s')}:0:0"
    state = sync_redis.hgetall(gen)
    assert int(state["n"]) == n
    buckets = 2 ** int(state["b"]) + int(state["p"])
    assert 48 * (buckets - 1) <= n <= 48 * buckets  # split as it grew: mean load 48
    sizes = [sync_redis.hlen(f"{gen}:{j}") for j in range(buckets)]
    assert sum(sizes) == n and max(sizes) < 128
    assert {sync_redis.object("encoding", f"{gen}:{j}") for j in range(buckets)} <= {
        "listpack", "ziplist"
    }
    # after the splits every URL is still found where lookups look for it
    again = run(redis_url, namespace, None,
                lambda w: w.add([task(f"https://example.com/{i}") for i in range(n)]))
    assert again == AddResult(0, n)


def test_release_works_in_either_generation(redis_url: str, namespace: str) -> None:
    clock = Clock(T0 + 10)
    a, b = task("https://example.com/a", DAY), task("https://example.com/b", DAY)

    async def body(w: TaskWriter) -> list[Any]:
        await w.add([a])
        clock.now = T0 + DAY + 5
        await w.add([b])  # a is in the previous generation, b in the current one
        out: list[Any] = [await w.release(a), await w.release(b)]
        out.append(await w.add([task(a.url), task(b.url)]))
        return out

    assert run(redis_url, namespace, clock, body) == [True, True, AddResult(2, 0)]


def test_server_config_check_warns_when_hashes_would_not_stay_compact(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    async def check() -> list[str]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await check_server_config(client)
        finally:
            await client.aclose()

    assert asyncio.run(check()) == []
    before = sync_redis.config_get("hash-max-ziplist-entries")["hash-max-ziplist-entries"]
    sync_redis.config_set("hash-max-ziplist-entries", 64)
    try:
        [warning] = asyncio.run(check())
    finally:
        sync_redis.config_set("hash-max-ziplist-entries", before)
    assert "64" in warning and "128" in warning

"""Entry time slots (dedup_lib.lua): a generation records how many slots its window has, so
entries written under the old resolution (8000, before the field existed) are read in their own
unit, and new entries stay in listpack's 2-byte integers (0..4095). Real Redis."""

from __future__ import annotations

import redis

from meteorseed_scrapy.queue.enqueue.dedup import fingerprint_bytes
from meteorseed_scrapy.queue.enqueue.enqueue_calls import AddResult
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from tests.test_dedup import DAY, T0, Clock, run, task


def _entry_buckets(client: redis.Redis, root: str, gen: int, entry: bytes) -> list[bytes]:
    return [key for key in client.scan_iter(f"{root}:{DAY}:{gen}:*".encode())
            if client.hexists(key, entry)]


def test_new_generations_record_their_slots_and_stay_below_4096(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    clock = Clock(T0 + DAY - 1)  # the last second of the generation: the highest slot

    async def body(w: TaskWriter) -> AddResult:
        return await w.add([task(f"https://example.com/{i}", DAY) for i in range(300)])

    assert run(redis_url, namespace, clock, body) == AddResult(300, 0)
    raw = redis.Redis.from_url(redis_url)
    root = KeyLayout(namespace).seen("s")
    gen = T0 // DAY
    assert raw.hget(f"{root}:{DAY}:{gen}", "q") == b"4096"
    slots = {int(v) for key in raw.scan_iter(f"{root}:{DAY}:{gen}:*".encode())
             for v in raw.hvals(key) if v}
    assert slots == {(DAY - 1) // -(-DAY // 4096)}  # the last slot, 22 s each: 3927 < 4096
    raw.close()


def test_an_old_generation_is_read_with_its_8000_slots(
        redis_url: str, namespace: str) -> None:
    url = "https://example.com/old"
    root = KeyLayout(namespace).seen("s")
    raw = redis.Redis.from_url(redis_url)
    clock = Clock(T0 + 100)

    async def first(w: TaskWriter) -> AddResult:
        return await w.add([task(url, DAY)])

    assert run(redis_url, namespace, clock, first) == AddResult(1, 0)
    # Rewrite the generation as the code before the 'q' field wrote it: 8000 slots of 11 s,
    # so the entry recorded 100 s in is slot 9, eligible again at T0 + DAY + 110.
    gen = T0 // DAY
    entry = fingerprint_bytes(task(url))[:6]
    [bucket] = _entry_buckets(raw, root, gen, entry)
    raw.hdel(f"{root}:{DAY}:{gen}", "q")
    raw.hset(bucket, entry, "9")

    async def later(w: TaskWriter) -> list[AddResult]:
        clock.now = T0 + DAY + 100  # inside the window in either unit
        out = [await w.add([task(url)])]
        clock.now = T0 + DAY + 150  # past it in 11 s slots; read as 4096 slots (22 s), not yet
        out.append(await w.add([task(url)]))
        return out

    assert run(redis_url, namespace, clock, later) == [AddResult(0, 1), AddResult(1, 0)]
    raw.close()

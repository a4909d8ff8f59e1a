"""A worker's late completions never ack an entry another worker reclaimed meanwhile.

Found on the simulated fleet (tests/test_fleet_partitions.py): a worker cut off from Redis for
longer than CLAIM_IDLE finishes its pages; another worker reclaims those tasks; when the link
heals, the first worker's queued acks went out as plain XACK + XDEL, which acked and deleted
entries now pending on (and being worked by) the other worker. Real Redis.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from redis.asyncio import Redis

from meteorseed_scrapy.queue.consume.acks import Completion
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.queue_helpers import ack


def _run(redis_url: str, namespace: str) -> dict[str, Any]:
    keys = KeyLayout(namespace)
    tasks = [ExecTask.create(seed_id="s1", site_id="news", url=f"https://example.com/p/{n}")
             for n in range(3)]

    async def main() -> dict[str, Any]:
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            await TaskWriter(client, keys).add(tasks)
            late = StreamConsumer(client, keys, "cut-off")
            other = StreamConsumer(client, keys, "other")
            await late.ensure_group()
            held = await late.read(3, 100)
            # CLAIM_IDLE passed while "cut-off" could not reach Redis: "other" reclaims two.
            await asyncio.sleep(0.05)
            taken = await other.reclaim(0.01, 2)
            out: dict[str, Any] = {"held": len(held), "taken": {d.ref for d in taken}}
            records = [Completion(d.task, '{"done": 1}') for d in held if d.task is not None]
            out["acked"] = await late.complete([d.ref for d in held], 600, done=records)
            out["others_ack"] = await ack(other, [d.ref for d in taken])
            return out
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_late_acks_skip_entries_another_worker_reclaimed(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    out = _run(redis_url, namespace)
    assert out["held"] == 3 and len(out["taken"]) == 2
    assert out["acked"] == 1, "only the entry still pending on the late worker is acked"
    # The reclaimed entries stayed pending on their new owner until it acked them itself.
    assert out["others_ack"] == 2
    assert sync_redis.xpending(keys.stream, GROUP)["pending"] == 0
    assert sync_redis.xlen(keys.stream) == 0


def test_a_late_deferral_leaves_a_reclaimed_task_to_its_new_owner(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    # The same partition, but the cut-off worker's queued action is a deferral (a 5xx to
    # retry later): defer.lua must not ack the entry from under the worker that reclaimed it
    # and queue a second copy of the task in the delayed set.
    keys = KeyLayout(namespace)
    task = ExecTask.create(seed_id="s1", site_id="news", url="https://example.com/p/late")

    async def main() -> tuple[bool, bool, int]:
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            await TaskWriter(client, keys).add([task])
            late = StreamConsumer(client, keys, "cut-off")
            other = StreamConsumer(client, keys, "other")
            await late.ensure_group()
            (held,) = await late.read(1, 100)
            taken: list[Any] = []
            while not taken:  # until the entry has been idle past the 10 ms min idle
                taken = await other.reclaim(0.01, 1)
            delayed = DelayedSet(client, keys)
            late_deferred = await delayed.defer(held.ref, task, 5.0, owner="cut-off")
            owner_deferred = await delayed.defer(taken[0].ref, task, 5.0, owner="other")
            return late_deferred, owner_deferred, int(await client.zcard(keys.delayed))
        finally:
            await client.aclose()

    late_deferred, owner_deferred, delayed = asyncio.run(main())
    assert not late_deferred, "the late worker's deferral is refused"
    assert owner_deferred and delayed == 1, "the owner's own deferral goes through, once"
    assert sync_redis.xpending(keys.stream, GROUP)["pending"] == 0

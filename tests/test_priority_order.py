"""A worker serves the highest priority first among what is available, as Scrapy's scheduler
does: a blocked read takes the highest band of what arrived (not the first stream written), and
the tasks it holds wait by priority, whatever order the reads gave them in."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from scrapy import Request

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.context import task_of
from meteorseed_scrapy.testing.polling import wait_until
from tests.test_consumer import arun
from tests.test_pump import Rig, make_task, ok, run


def _priority(request: Request) -> int:
    task = task_of(request)
    assert task is not None
    return task.priority


def test_a_blocked_read_takes_the_highest_band_of_what_arrived(
    redis_url: str, namespace: str
) -> None:
    keys = KeyLayout(namespace)

    async def body(client: Redis) -> list[int]:
        consumer = StreamConsumer(client, keys, "c1")
        await consumer.ensure_group()
        writer = TaskWriter(client, keys)
        # (a first write loads the script: a script the server lacks is run call by call)
        await writer.add([make_task(9)], dedup=False)
        assert len(await consumer.read(1, 0)) == 1
        reading = asyncio.ensure_future(consumer.read(2, 10_000))

        async def blocked() -> bool:
            return any("b" in c["flags"] for c in await client.client_list())

        await wait_until(blocked, 30, 0.01)
        # One batch: the normal band's stream is written first, then the high band's.
        await writer.add(
            [make_task(i, priority=p) for i, p in enumerate((0, 0, 5, 5))], dedup=False)
        got = await asyncio.wait_for(reading, 9)
        return [d.task.priority for d in got if d.task]

    assert arun(redis_url, body) == [5, 5]


def test_children_yielded_low_then_high_are_served_high_first(
    redis_url: str, namespace: str
) -> None:
    parent = make_task(0)

    async def body(rig: Rig) -> list[str]:
        await rig.enqueue(parent)
        request = await rig.take()
        scrape = rig.pump.scrape_started(request)
        for name, priority in (("low0", 0), ("low1", 0), ("low2", 0),
                               ("high0", 10), ("high1", 10), ("high2", 10)):
            assert rig.pump.child(scrape, Request(f"https://shop.test/{name}",
                                                  priority=priority))
        rig.pump.finished(request, ok(request))
        served = []
        for _ in range(6):
            child = await rig.take()
            served.append(child.url.rsplit("/", 1)[1])
            rig.pump.scrape_started(child)
            rig.pump.finished(child, ok(child))
        return served

    assert run(redis_url, namespace, body, CONCURRENT_REQUESTS=1) == [
        "high0", "high1", "high2", "low0", "low1", "low2"]


def test_tasks_of_one_band_held_together_go_by_their_own_priority(
    redis_url: str, namespace: str
) -> None:
    async def body(rig: Rig) -> list[int]:
        # One band (high), read together in arrival order 1, 7, 3; then 9 to another site.
        await rig.enqueue(*(make_task(i, priority=p) for i, p in enumerate((1, 7, 3))))
        await wait_until(lambda: rig.pump.wanted()[1] == 3)
        await rig.enqueue(make_task(9, site_id="other", priority=9))
        await wait_until(lambda: rig.pump.wanted()[1] == 4)
        return [_priority(await rig.take()) for _ in range(4)]

    assert run(redis_url, namespace, body) == [9, 7, 3, 1]

"""A settled task's completion pipeline (record, XACK, XDEL) leaves at once, from the settling
code itself, without a turn of the flush loop; under back-pressure the acks gather."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio as aioredis
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_until
from meteorseed_scrapy.worker import completions as completions_module
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.fate import Outcome, Verdict
from meteorseed_scrapy.worker.ledger import Entry

DONE = Verdict(Outcome.DONE, status=200)


async def _rig(redis_url: str, namespace: str, n: int
               ) -> tuple[Any, StreamConsumer, Completions, list[Entry]]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    keys = KeyLayout(namespace)
    consumer = StreamConsumer(client, keys, "w1")
    await consumer.ensure_group()
    tasks = [ExecTask.create(seed_id="s", site_id="site", url=f"https://example.com/{i}")
             for i in range(n)]
    await TaskWriter(client, keys).add(tasks)
    got = await consumer.read(n, 0)
    config = WorkerConfig.from_settings({"METEORSEED_REDIS_URL": redis_url,
                                         "METEORSEED_NAMESPACE": namespace})
    comp = Completions(consumer, TaskWriter(client, keys), None, config,  # type: ignore[arg-type]
                       MemoryStatsCollector(get_crawler()), on_child_durable=lambda _: None,
                       on_new_urls=lambda _: None)
    entries = []
    for d in got:
        assert d.task is not None
        entry = Entry(d.task, [d], started=True, response_at=1.0)
        entry.verdict = DONE
        entries.append(entry)
    return client, consumer, comp, entries


def test_a_settled_task_is_acked_without_the_flush_loop(redis_url: str,
                                                        namespace: str) -> None:
    async def body() -> None:
        client, _, comp, entries = await _rig(redis_url, namespace, 1)
        try:
            comp.settled(entries[0], DONE)
            # No flush loop runs here: the pipeline left from settled() itself.
            await wait_until(lambda: not comp.busy(), 10)
            assert not comp.needed.is_set()  # nothing left that needed the loop
            keys = KeyLayout(namespace)
            assert await client.xlen(keys.stream) == 0  # acked and deleted
            record = json.loads(await client.get(keys.done(entries[0].task.task_id)))
            assert (record["outcome"], record["status"]) == ("done", 200)
        finally:
            await client.aclose()

    asyncio.run(body())


def test_tasks_settling_in_the_same_turn_go_in_one_pipeline(redis_url: str,
                                                           namespace: str) -> None:
    async def body() -> None:
        client, consumer, comp, entries = await _rig(redis_url, namespace, 5)
        sent: list[int] = []
        complete = consumer.complete

        async def counted(refs: Any, *args: Any) -> int:
            sent.append(len(refs))
            return await complete(refs, *args)

        consumer.complete = counted  # type: ignore[method-assign]
        try:
            for entry in entries:
                comp.settled(entry, DONE)
            assert not comp.needed.is_set()  # (the flush loop is not needed for them)
            await wait_until(lambda: not comp.busy(), 10)
            assert sent == [5]
            assert await client.xlen(KeyLayout(namespace).stream) == 0
        finally:
            await client.aclose()

    asyncio.run(body())


def test_with_pipelines_on_the_wire_acks_gather_for_the_flush_loop(
        redis_url: str, namespace: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(completions_module, "MAX_COMPLETING", 1)

    async def body() -> None:
        client, consumer, comp, entries = await _rig(redis_url, namespace, 5)
        gate = asyncio.Event()
        complete = consumer.complete

        async def held(*args: Any) -> int:
            await gate.wait()
            return await complete(*args)

        consumer.complete = held  # type: ignore[method-assign]
        try:
            comp.settled(entries[0], DONE)
            await wait_until(lambda: not comp.acks, 10)  # its pipeline took it: on the wire
            for entry in entries[1:]:
                comp.settled(entry, DONE)
            # One pipeline on the wire, the most allowed: the other four wait, together,
            # for the flush loop.
            assert len(comp.acks) == 4 and comp.needed.is_set()
            gate.set()
            await wait_until(lambda: not comp._completing, 10)
            await comp.flush_once()
            await comp.drain()
            assert await client.xlen(KeyLayout(namespace).stream) == 0
            assert comp.stats.get_value("meteorseed/acked") == 5
        finally:
            await client.aclose()

    asyncio.run(body())


def test_a_pipeline_cancelled_before_it_started_leaves_nothing_stuck(redis_url: str,
                                                                     namespace: str) -> None:
    async def body() -> None:
        client, _, comp, entries = await _rig(redis_url, namespace, 2)
        try:
            comp.settled(entries[0], DONE)
            [starting] = comp._completing
            starting.cancel()  # (before its first step: its records are still queued)
            await asyncio.wait([starting])
            await wait_until(lambda: not comp._completing, 10)  # (its callbacks ran)
            comp.settled(entries[1], DONE)  # a new pipeline takes both
            await wait_until(lambda: not comp.busy(), 10)
            assert await client.xlen(KeyLayout(namespace).stream) == 0
            assert comp.stats.get_value("meteorseed/acked") == 2
        finally:
            await client.aclose()

    asyncio.run(body())

"""A dead-lettered task's dedup key is computed once by the worker's flush: its dead letter
releases its URL with it and its task history record is keyed by the same, against a real
Redis. What is stored is what two computations stored: the letter, the released URL, the
record under the writer's key."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import redis.asyncio as aioredis
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.task_history import TaskHistory, decode_record
from meteorseed_scrapy.queue.enqueue.dedup import fingerprint_bytes
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.scripts import script_source
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.fate import Outcome, Verdict
from meteorseed_scrapy.worker.ledger import Entry

SITE = "keys"
DEAD = Verdict(Outcome.DEAD, reason="HTTP 500, for good")
DONE = Verdict(Outcome.DONE, status=200)




class CountingWriter(TaskWriter):
    """The worker's writer, counting its dedup key computations per URL; ``keyless`` URLs
    have none (a project fingerprinter that fails on them)."""

    def __init__(self, *args: Any, keyless: frozenset[str] = frozenset(), **kwargs: Any
                 ) -> None:
        super().__init__(*args, **kwargs)
        self.computed: Counter[str] = Counter()
        self.keyless = keyless

    def fingerprint(self, task: ExecTask) -> bytes:
        self.computed[task.url] += 1
        if task.url in self.keyless:
            raise ValueError("no dedup key")
        return super().fingerprint(task)


async def _rig(client: aioredis.Redis, keys: KeyLayout, urls: list[str], redis_url: str, *,
               keyless: frozenset[str] = frozenset()
               ) -> tuple[StreamConsumer, CountingWriter, Completions, list[Entry]]:
    consumer = StreamConsumer(client, keys, "w1")
    await consumer.ensure_group()
    tasks = [ExecTask.create(seed_id="s", site_id=SITE, url=url) for url in urls]
    await TaskWriter(client, keys).add(tasks)
    got = await consumer.read(len(tasks), 0)
    writer = CountingWriter(client, keys, keyless=keyless)
    config = WorkerConfig.from_settings({"METEORSEED_REDIS_URL": redis_url,
                                         "METEORSEED_NAMESPACE": keys.namespace})
    comp = Completions(consumer, writer, None, config, MemoryStatsCollector(get_crawler()),  # type: ignore[arg-type]
                       on_child_durable=lambda _: None, on_new_urls=lambda _: None,
                       history=TaskHistory(client, keys, 86400, 100))
    comp.closing = True  # (the history is written by the same flush)
    entries = []
    for d in got:
        assert d.task is not None
        entries.append(Entry(d.task, [d], started=True, response_at=1.0))
    return consumer, writer, comp, entries


async def _record(client: aioredis.Redis, keys: KeyLayout, task: ExecTask
                  ) -> dict[str, Any] | None:
    reply = await client.eval(script_source("history_get"), 1, keys.history(SITE),
                              fingerprint_bytes(task))
    return decode_record(reply)


async def _enqueued_again(client: aioredis.Redis, keys: KeyLayout, task: ExecTask) -> bool:
    """Whether the URL of ``task`` was released: a new task for it is not a duplicate."""
    again = ExecTask.create(seed_id="s2", site_id=SITE, url=task.url)
    return (await TaskWriter(client, keys).add([again])).enqueued == 1


def test_a_dead_letter_s_key_is_computed_once_for_its_release_and_its_record(
        redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)

    async def body() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            consumer, writer, comp, entries = await _rig(
                client, keys, ["https://keys.test/dead", "https://keys.test/done"], redis_url)
            dead, done = entries
            letter = consumer.dead_letter

            async def settling_meanwhile(*args: Any) -> str:
                # Another task settles while the dead letter is on the wire: its record's
                # key is computed then, and the dead one's is still not computed again.
                comp.settled(done, DONE)
                return await letter(*args)

            consumer.dead_letter = settling_meanwhile  # type: ignore[method-assign]
            comp.settled(dead, DEAD)
            await comp.flush_once()
            await comp.flush_once()  # (the done task's ack, queued while the first ran)
            await comp.drain()
            assert writer.computed == {dead.task.url: 1, done.task.url: 1}
            letters = await client.xrange(keys.dead)
            assert [f["reason"] for _, f in letters] == [DEAD.reason]
            record = await _record(client, keys, dead.task)
            assert record is not None and record["outcome"] == "dead"
            assert record["reason"] and DEAD.reason.startswith(record["reason"])
            assert await _enqueued_again(client, keys, dead.task)  # its URL was released
            done_record = await _record(client, keys, done.task)
            assert done_record is not None and done_record["outcome"] == "done"
        finally:
            await client.aclose()

    asyncio.run(body())


def test_a_dead_task_without_a_key_is_dead_lettered_and_has_no_record(
        redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    url = "https://keys.test/keyless"

    async def body() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            _, writer, comp, [dead] = await _rig(client, keys, [url], redis_url,
                                                 keyless=frozenset([url]))
            comp.settled(dead, DEAD)
            await comp.flush_once()
            assert writer.computed == {url: 1}  # tried once, for both
            assert len(await client.xrange(keys.dead)) == 1
            assert await _record(client, keys, dead.task) is None
            assert not await _enqueued_again(client, keys, dead.task)  # nothing released
        finally:
            await client.aclose()

    asyncio.run(body())

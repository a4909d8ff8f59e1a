"""ChildOutbox against a real redis-server: children are encoded when yielded, and one child
the writer cannot take fails its parent alone, never the flush (issue 27 point 1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.queue.enqueue.writer import FingerprintError, TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.context import Scrape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.children import ChildOutbox


class Failing:
    def fingerprint(self, request: Any) -> bytes:
        if "bad" in request.url:
            raise ValueError("no fingerprint for you")
        return request.url.encode()


def task(path: str) -> ExecTask:
    return ExecTask.create(seed_id="s1", site_id="shop", url=f"https://shop.test/{path}")


def outbox(client: Any, namespace: str, written: list[str], **writer: Any) -> ChildOutbox:
    stats = MemoryStatsCollector(get_crawler())
    return ChildOutbox(TaskWriter(client, KeyLayout(namespace), **writer), stats,
                       on_written=written.append, on_new_urls=lambda seeds: None)


def test_a_child_the_fingerprinter_fails_for_is_refused_when_yielded(
    redis_url: str, namespace: str
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        written: list[str] = []
        children = outbox(client, namespace, written, fingerprinter=Failing())
        parent = Scrape(task("parent"))
        with pytest.raises(FingerprintError, match="url: cannot be fingerprinted"):
            children.add(task("bad"), parent, dedup=True)
        children.add(task("good"), parent, dedup=True)
        assert len(children) == 1
        await children.flush()
        assert written == [parent.task.task_id] and len(children) == 0
        assert await client.xlen(KeyLayout(namespace).stream) == 1
        await client.aclose()

    asyncio.run(main())


def test_a_child_the_writer_cannot_take_fails_its_parent_and_the_rest_is_written(
    redis_url: str, namespace: str
) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        written: list[str] = []
        children = outbox(client, namespace, written)
        parents = [Scrape(task(f"parent/{i}")) for i in range(5)]
        for i, parent in enumerate(parents):
            children.add(task(f"child/{i}"), parent, dedup=i % 2 == 0)
        # A child that passed its checks and still breaks the script call (here a raw newline
        # in its JSON, which the writer refuses to pack): it must not hold the others back.
        poison = children.queue[2]
        children.queue[2] = poison._replace(encoded=poison.encoded._replace(
            payload=poison.encoded.payload + "\n"))
        await children.flush()
        assert len(children) == 0
        assert written == [p.task.task_id for p in parents]  # each parent hears of its child
        assert [p.errors for p in parents[:2] + parents[3:]] == [[]] * 4
        [error] = parents[2].errors
        assert error.startswith("yielded request https://shop.test/child/2: ValueError: ")
        assert "raw newline" in error
        assert await client.xlen(KeyLayout(namespace).stream) == 4
        assert children.stats.get_value("meteorseed/children/rejected") == 1
        assert children.stats.get_value("meteorseed/children/enqueued") == 4
        await client.aclose()

    asyncio.run(main())


def test_redis_away_keeps_every_child_queued(redis_url: str, namespace: str) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
        written: list[str] = []
        children = outbox(client, namespace, written)
        parent = Scrape(task("parent"))
        children.add(task("child"), parent, dedup=True)
        with pytest.raises((aioredis.ConnectionError, OSError)):
            await children.flush()
        assert len(children) == 1 and written == [] and parent.errors == []
        await client.aclose()

    asyncio.run(main())

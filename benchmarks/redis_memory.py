"""Redis memory per waiting task, per pending task, per dedup URL and per completion record.

    .venv/bin/python benchmarks/redis_memory.py [--count 20000]

Each figure is the growth of INFO ``used_memory`` when ``count`` of one kind of record are
added to an otherwise empty throwaway Redis (FLUSHALL before each measurement), divided by
``count``. The records are the real ones: tasks written by TaskWriter (the enqueue script),
fingerprints as TaskWriter computes them, completion records shaped like
``ledger.Entry.record()`` with the same key and TTL as a worker writes. URLs are ~70 characters,
like a typical article URL; a task's JSON size is printed so the figure can be scaled.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meteorseed_scrapy.queue.enqueue.dedup import fingerprint
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.redis_server import RedisServer

KEYS = KeyLayout("mem")


def make_tasks(count: int) -> list[ExecTask]:
    return [ExecTask.create(seed_id="news-daily", site_id="example_news",
                            url=f"https://www.example-news.com/articles/2024/05/story-{i:07d}.html")
            for i in range(count)]


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(client: redis.Redis, label: str, count: int, action: Callable[[], None]) -> float:
    client.flushall()
    before = used(client)
    action()
    per = (used(client) - before) / count
    print(f"{label:<48}{per:8.1f} bytes")
    return per


def enqueue(url: str, tasks: list[ExecTask], dedup: bool) -> None:
    async def run() -> None:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            await TaskWriter(client, KEYS).add(tasks, dedup=dedup)
        finally:
            await client.aclose()

    asyncio.run(run())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20000)
    n = parser.parse_args().count
    tasks = make_tasks(n)
    size = len(tasks[0].to_message()["t"])
    ttl = int(DEFAULTS["METEORSEED_DONE_TTL"])
    record = json.dumps({"outcome": "done", "items": 1,
                         "digest": hashlib.sha256(b"x").hexdigest(), "status": 200,
                         "at": round(time.time(), 3)}, separators=(",", ":"))
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        print(f"{n} records each; task JSON {size} bytes; completion record {len(record)} bytes")

        measure(client, "waiting task (stream entry, no dedup)", n,
                lambda: enqueue(server.url, tasks, dedup=False))

        def waiting_then_pending() -> None:
            enqueue(server.url, tasks, dedup=False)
            client.xgroup_create(KEYS.stream, GROUP, id="0")
            base = used(client)
            for _ in range(0, n, 1000):
                client.xreadgroup(GROUP, "w1", {KEYS.stream: ">"}, count=1000)
            print(f"{'  of which the pending entry (PEL)':<48}{(used(client) - base) / n:8.1f}"
                  " bytes")

        measure(client, "pending task (stream entry + PEL)", n, waiting_then_pending)

        def seen() -> None:
            pipe = client.pipeline(transaction=False)
            for task in tasks:
                pipe.sadd(KEYS.seen(task.site_id), fingerprint(task))
            pipe.execute()

        measure(client, "dedup URL (member of <ns>:seen:{site})", n, seen)
        measure(client, "waiting task with its dedup URL", n,
                lambda: enqueue(server.url, tasks, dedup=True))

        def done() -> None:
            pipe = client.pipeline(transaction=False)
            for task in tasks:
                pipe.set(KEYS.done(task.task_id), record, ex=ttl)
            pipe.execute()

        measure(client, f"completion record (<ns>:done:<id>, {ttl} s TTL)", n, done)
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

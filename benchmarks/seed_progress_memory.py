"""Redis memory per seed of the progress counters (``<ns>:crawl:<seed_id>``).

    .venv/bin/python benchmarks/seed_progress_memory.py [--seeds 1000] [--tasks 3]

A throwaway Redis; each of N seeds gets T tasks enqueued (TaskWriter), all read and acked
(StreamConsumer.complete, with items and bytes), so each seed finished; then each seed is
enqueued once more (a second run: the counters restart and keep the first run's as
``previous``). ``MEMORY USAGE`` of every seed's hash is summed at each step, with ``used_memory``
growth for comparison. The per-site hash (one per site, not per seed) is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer  # noqa: E402
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter  # noqa: E402
from meteorseed_scrapy.queue.fleet.crawl_progress import Settle  # noqa: E402
from meteorseed_scrapy.queue.keys import KeyLayout  # noqa: E402
from meteorseed_scrapy.task.exec_task import ExecTask  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402


async def _usage(client: Any, keys: KeyLayout, seeds: list[str]) -> int:
    pipe = client.pipeline(transaction=False)
    for seed in seeds:
        pipe.memory_usage(keys.only.crawl(seed), samples=0)
    return sum(int(n or 0) for n in await pipe.execute())


async def _settle(consumer: StreamConsumer) -> None:
    while deliveries := await consumer.read(500, 0):
        await consumer.complete((), [d.ref for d in deliveries], 60,
                                [Settle(d.task.seed_id, d.task.site_id, 1, 0, 20_000)
                                 for d in deliveries if d.task])


async def run(url: str, n: int, tasks: int) -> None:
    keys = KeyLayout("bench")
    client = aioredis.Redis.from_url(url, decode_responses=True)
    seeds = [f"seed-{i:06d}" for i in range(n)]
    try:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        writer = TaskWriter(client, keys)

        async def enqueue(run_no: int) -> None:
            await writer.add([ExecTask.create(seed_id=seed, site_id="site",
                                              url=f"https://site.example/{seed}/{run_no}/{t}")
                              for seed in seeds for t in range(tasks)])

        await enqueue(1)
        running = await _usage(client, keys, seeds)
        await _settle(consumer)
        finished = await _usage(client, keys, seeds)
        await enqueue(2)
        second = await _usage(client, keys, seeds)
        sample = await client.hgetall(keys.only.crawl(seeds[0]))
    finally:
        await client.aclose()
    print(f"{n} seeds x {tasks} tasks; one seed's hash in its second run: {sample}")
    print(f"bytes per seed (MEMORY USAGE): running {running / n:.0f}, finished "
          f"{finished / n:.0f}, second run (with the first's final counters) {second / n:.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=3, help="tasks per seed")
    args = parser.parse_args()
    with RedisServer() as server:
        asyncio.run(run(server.url, args.seeds, args.tasks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

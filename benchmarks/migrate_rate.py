"""Migration rate: N waiting scrapy-redis requests (its PriorityQueue, written by the real
scrapy_redis package) turned into exec tasks on the stream, on a throwaway local Redis.

``python benchmarks/migrate_rate.py [--requests 100000] [--move]``; the last line is the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import redis
import redis.asyncio as aioredis
from scrapy import Request, Spider
from scrapy_redis.queue import PriorityQueue

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meteorseed_scrapy.migrate.convert import Origin
from meteorseed_scrapy.migrate.scrapy_redis import ScrapyRedisSource, migrate
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.redis_server import RedisServer


class Shop(Spider):
    name = "shop"

    def parse_product(self, response: object) -> None: ...


def fill(url: str, count: int) -> None:
    client = redis.Redis.from_url(url)
    spider = Shop()
    queue = PriorityQueue(client, spider, "%(spider)s:requests")
    with client.pipeline(transaction=False) as pipe:
        # scrapy-redis's own encoding (to_dict + pickle); ZADD batched only to fill faster.
        for i in range(count):
            request = Request(f"https://shop.example/product/{i}?ref=list{i % 50}",
                              callback=spider.parse_product, priority=i % 10,
                              meta={"category": i % 50, "depth": 2},
                              headers={"Referer": "https://shop.example/"})
            pipe.execute_command("ZADD", queue.key, -request.priority,
                                 queue._encode_request(request))
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
    client.close()


async def run(url: str, move: bool, batch: int) -> tuple[float, str]:
    client = aioredis.Redis.from_url(url)
    try:
        source = ScrapyRedisSource("shop", "shop:requests", "shop:start_urls")
        started = time.perf_counter()
        summary = await migrate(client, TaskWriter(client, KeyLayout("bench")), source,
                                Origin("shop", "scrapy-redis"), move=move, batch_size=batch)
        return time.perf_counter() - started, str(summary)
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--move", action="store_true")
    opts = parser.parse_args()
    with RedisServer() as server:
        fill(server.url, opts.requests)
        elapsed, summary = asyncio.run(run(server.url, opts.move, opts.batch_size))
        print(summary)
    rate = opts.requests / elapsed
    mode = "moved" if opts.move else "copied"
    print(f"migration rate: {opts.requests} waiting scrapy-redis requests {mode} to the stream "
          f"in {elapsed:.1f} s = {rate:,.0f} requests/s")


if __name__ == "__main__":
    main()

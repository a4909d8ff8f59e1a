"""seed-expand with dedup on vs raw redis-py pipelined XADD of as many task messages.

    python benchmarks/seed_expand_rate.py [--urls 1000000] [--window 2592000] [--rounds 3]

Both run in this process against one throwaway redis-server (default config), in rounds that
alternate which side goes first (the machine is shared and noisy: the figure is the median of
the per-round ratios, each from two runs taken one right after the other). The seed side
is the real path: JSON Lines seeds (url_list lines of 10 000 URLs, 10 % of them duplicates)
through ``expand_stream`` (parse, validate, canonicalise, fingerprint, encode) and
``TaskWriter`` (enqueue.lua: dedup + XADD), with a 30-day re-crawl window by default. The raw
side XADDs the same number of ready-made task messages in pipelines of 500. The last line is
the figure: the ratio of the two rates (goal >= 0.45).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import redis
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.writer import TaskWriter
from meteorseed_scrapy.seeding.expand import expand_stream
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.redis_server import RedisServer

PER_LINE = 10_000


def seed_lines(n: int, window: int) -> Iterator[str]:
    """n URLs in url_list lines; every 10th URL repeats an earlier one (10 % duplicates)."""
    meta = {"recrawl_after": window} if window else {}
    urls: list[str] = []
    for i in range(n):
        j = i - 5 if i % 10 == 9 else i
        urls.append(f"https://news.example.com/article/{j}?ref=list")
        if len(urls) == PER_LINE:
            yield json.dumps({"seed_id": "bench", "site_id": "news", "task_type": "url_list",
                              "payload": {"urls": urls}, "meta": meta})
            urls = []
    if urls:
        yield json.dumps({"seed_id": "bench", "site_id": "news", "task_type": "url_list",
                          "payload": {"urls": urls}, "meta": meta})


def raw_xadd(url: str, n: int) -> float:
    client = redis.Redis.from_url(url)
    stream = "raw:tasks"
    messages = [ExecTask.create(seed_id="bench", site_id="news",
                                url=f"https://news.example.com/article/{i}?ref=list").to_message()
                for i in range(min(n, 10_000))]
    t0 = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(stream, messages[i % len(messages)])  # type: ignore[arg-type]
        if len(pipe) >= 500:
            pipe.execute()
    pipe.execute()
    elapsed = time.perf_counter() - t0
    assert client.xlen(stream) == n
    client.delete(stream)
    client.close()
    return n / elapsed


async def seed_expand(url: str, n: int, window: int) -> tuple[float, int, int]:
    client = aioredis.Redis.from_url(url)
    writer = TaskWriter(client, KeyLayout("bench"))
    lines = list(seed_lines(n, window))  # read from memory: the file system is not measured
    t0 = time.perf_counter()
    summary = await expand_stream(lines, writer, on_error=print, max_backlog=10 * n)
    elapsed = time.perf_counter() - t0
    await client.aclose()
    return n / elapsed, summary.enqueued, summary.duplicates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--window", type=int, default=30 * 86400,
                        help="recrawl_after of the seeds in seconds (0 = none)")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    expected_dups = opts.urls // 10
    ratios = []
    for rnd in range(opts.rounds):
        # A fresh server per round: every round dedups the same URLs from scratch.
        with RedisServer() as server:
            if rnd % 2:
                seeded = asyncio.run(seed_expand(server.url, opts.urls, opts.window))
                raw = raw_xadd(server.url, opts.urls)
            else:
                raw = raw_xadd(server.url, opts.urls)
                seeded = asyncio.run(seed_expand(server.url, opts.urls, opts.window))
        rate, enqueued, duplicates = seeded
        ratios.append(rate / raw)
        print(f"round {rnd + 1}: raw pipelined XADD {raw:,.0f} msg/s; seed-expand with dedup "
              f"{rate:,.0f} URLs/s (enqueued {enqueued:,}, duplicates {duplicates:,}; expected "
              f"{opts.urls - expected_dups:,} / {expected_dups:,}); ratio {rate / raw:.2f}",
              flush=True)
    print(f"seed-expand / raw XADD: {statistics.median(ratios):.2f}x, median of {opts.rounds} "
          f"alternating rounds ({', '.join(f'{r:.2f}' for r in ratios)}) (goal >= 0.45)")


if __name__ == "__main__":
    main()

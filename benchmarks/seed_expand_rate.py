"""seed-expand with dedup on vs raw redis-py pipelined XADD of as many task messages.

    python benchmarks/seed_expand_rate.py [--urls 1000000] [--window 2592000] [--rounds 3]

Both run in this process against one throwaway redis-server (default config), in rounds that
alternate which side goes first (the machine is shared and noisy: the figure is the median of
the per-round ratios, each from two runs taken one right after the other). The seed side
is the real path: JSON Lines seeds (url_list lines of 10 000 URLs, 10 % of them duplicates)
through ``expand_lines`` (the engine: parse, validate, canonicalise, fingerprint, encode) and
``TaskWriter`` (enqueue.lua: dedup + XADD), with a 30-day re-crawl window by default. The raw
side XADDs the same number of ready-made task messages in pipelines of 500. Each round also
prints the CPU time per URL of each side, client (this process) and Redis (INFO cpu): unlike
the rates, those hold on a machine that other work keeps busy. The last line is the figure:
the median ratio of the two rates (goal >= 1.0).
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

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.expand import expand_lines
from meteorseed_scrapy.seeding.expand_types import ExpandOptions
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


class Cpu:
    """CPU seconds of this process and of the Redis server over the timed part of one side."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _now(self) -> tuple[float, float]:
        info = self.client.info("cpu")
        return time.process_time(), float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def start(self) -> None:
        self.client = redis.Redis.from_url(self.url)
        self.begin = self._now()

    def stop(self) -> None:
        end = self._now()
        self.python, self.redis = end[0] - self.begin[0], end[1] - self.begin[1]
        self.client.close()

    def per_url(self, n: int) -> str:
        return (f"CPU/URL {self.python / n * 1e6:.1f} us client + "
                f"{self.redis / n * 1e6:.1f} us Redis")


def raw_xadd(url: str, n: int, cpu: Cpu) -> float:
    client = redis.Redis.from_url(url)
    stream = "raw:tasks"
    messages = [ExecTask.create(seed_id="bench", site_id="news",
                                url=f"https://news.example.com/article/{i}?ref=list").to_message()
                for i in range(min(n, 10_000))]
    cpu.start()
    t0 = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(stream, messages[i % len(messages)])  # type: ignore[arg-type]
        if len(pipe) >= 500:
            pipe.execute()
    pipe.execute()
    elapsed = time.perf_counter() - t0
    cpu.stop()
    assert client.xlen(stream) == n
    client.delete(stream)
    client.close()
    return n / elapsed


async def seed_expand(url: str, n: int, window: int, cpu: Cpu) -> tuple[float, int, int]:
    client = aioredis.Redis.from_url(url)
    writer = TaskWriter(client, KeyLayout("bench"))
    lines = list(seed_lines(n, window))  # read from memory: the file system is not measured
    cpu.start()
    t0 = time.perf_counter()
    summary = await expand_lines(lines, writer, ExpandOptions(max_backlog=10 * n), on_error=print)
    elapsed = time.perf_counter() - t0
    cpu.stop()
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
    ratios, cpu_ratios = [], []
    for rnd in range(opts.rounds):
        # A fresh server per round: every round dedups the same URLs from scratch.
        with RedisServer() as server:
            raw_cpu, seed_cpu = Cpu(server.url), Cpu(server.url)
            for side in ("seed", "raw") if rnd % 2 else ("raw", "seed"):
                if side == "raw":
                    raw = raw_xadd(server.url, opts.urls, raw_cpu)
                else:
                    seeded = asyncio.run(seed_expand(server.url, opts.urls, opts.window,
                                                     seed_cpu))
        rate, enqueued, duplicates = seeded
        ratios.append(rate / raw)
        # The larger of a side's two CPU costs bounds its rate on two cores (they overlap).
        cpu_ratios.append(max(raw_cpu.python, raw_cpu.redis)
                          / max(seed_cpu.python, seed_cpu.redis))
        print(f"round {rnd + 1}: raw pipelined XADD {raw:,.0f} msg/s "
              f"({raw_cpu.per_url(opts.urls)}); seed-expand with dedup {rate:,.0f} URLs/s "
              f"({seed_cpu.per_url(opts.urls)}; enqueued {enqueued:,}, duplicates "
              f"{duplicates:,}; expected {opts.urls - expected_dups:,} / {expected_dups:,}); "
              f"ratio {rate / raw:.2f}", flush=True)
    print(f"CPU-bound ratio (max(client, Redis) CPU per URL, raw / seed-expand): "
          f"{statistics.median(cpu_ratios):.2f}x, median of "
          f"({', '.join(f'{r:.2f}' for r in cpu_ratios)})")
    print(f"seed-expand / raw XADD: {statistics.median(ratios):.2f}x, median of {opts.rounds} "
          f"alternating rounds ({', '.join(f'{r:.2f}' for r in ratios)}) (goal >= 1.0)")


if __name__ == "__main__":
    main()

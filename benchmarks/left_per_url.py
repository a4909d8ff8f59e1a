"""Redis bytes left per URL once ``url_list`` seeds were expanded and every task was acked.

    .venv/bin/python benchmarks/left_per_url.py [--urls 1000000] [--per-seed 1000]

Seeds of ``--per-seed`` URLs each (one site) go through the expansion engine with the seed
registry watching, as ``scrapy seed-expand FILE`` runs it; then one consumer reads every task
and completes it as a worker does (completion record + ack + XDEL, and the task history record
of :mod:`meteorseed_scrapy.queue.consume.task_history`), with no fetch. What is left is measured
twice:
at once (completion records still alive for ``METEORSEED_DONE_TTL``) and once they expired,
with the history kept for its retention, then once the history is gone too. Each figure is
INFO ``used_memory`` above an empty server, per URL, with the bytes of each key kind
(``MEMORY USAGE``, sampled) beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import redis
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meteorseed_scrapy.commands.expand_file import ExpandedSeeds
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.task_history import HistoryEntry, TaskHistory
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.expand import expand_lines
from meteorseed_scrapy.seeding.expand_types import ExpandOptions
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.testing.redis_server import RedisServer

KEYS = KeyLayout("left")
SITE = "example_news"


def seed_lines(n: int, per_seed: int) -> Iterator[str]:
    for start in range(0, n, per_seed):
        urls = [f"https://www.example-news.com/articles/2024/05/story-{i:07d}.html"
                for i in range(start, min(n, start + per_seed))]
        yield json.dumps({"seed_id": f"batch-{start // per_seed:05d}", "site_id": SITE,
                          "task_type": "url_list", "payload": {"urls": urls}})


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def kind_of(key: str) -> str:
    """The key's kind: its name with ids and numbers folded."""
    parts = key.split(":")
    kind = parts[1] if len(parts) > 1 else key
    if kind in ("done", "failed", "seed"):
        return f"<ns>:{kind}:<id>"
    if kind.startswith("seen") or kind == "hist":
        return f"<ns>:{kind}:{{site}}..."
    return ":".join(["<ns>", *parts[1:3]])


def breakdown(client: redis.Redis, sample: float) -> dict[str, tuple[int, float]]:
    """Key kind -> (keys, estimated bytes by MEMORY USAGE over a sample of them)."""
    counts: Counter[str] = Counter()
    sampled: Counter[str] = Counter()
    picked: list[str] = []
    for key in client.scan_iter(count=5000):
        kind = kind_of(key)
        counts[kind] += 1
        if random.random() < sample:
            picked.append(key)
    pipe = client.pipeline(transaction=False)
    for key in picked:
        pipe.memory_usage(key, samples=0)
    sizes = pipe.execute()
    per: Counter[str] = Counter()
    for key, size in zip(picked, sizes, strict=True):
        per[kind_of(key)] += int(size or 0)
        sampled[kind_of(key)] += 1
    return {kind: (n, per[kind] / sampled[kind] * n if sampled[kind] else 0.0)
            for kind, n in counts.items()}


def settled(client: redis.Redis) -> int:
    """used_memory once Redis's cron has shrunk the keyspace's tables after mass deletes
    (it resizes them a step at a time): stable over half a second, or after 20 s."""
    last, deadline = used(client), time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = used(client)
        if abs(now - last) < 4096:
            return now
        last = now
    return last


def history_records(client: redis.Redis) -> int:
    """Records in the history generations (their ``n``)."""
    total = 0
    for key in client.scan_iter(f"{KEYS.namespace}:hist:*", count=5000):
        if key.count(":") == 4:  # <ns>:hist:{site}:<w>:<g>, a generation's state
            total += int(client.hget(key, "n") or 0)
    return total


def report(client: redis.Redis, label: str, base: int, n: int, sample: float) -> None:
    total = settled(client) - base
    print(f"{label}: {total / n:7.2f} B/URL ({total:,} B over {n:,} URLs)")
    for kind, (keys, size) in sorted(breakdown(client, sample).items(), key=lambda r: -r[1][1]):
        if size / n < 0.005:
            continue
        print(f"    {kind:<34}{keys:>9,} keys  ~{size / n:7.2f} B/URL")
        if kind.startswith("<ns>:hist"):
            records = history_records(client)
            print(f"    {'':<34}{records:>9,} history records, ~{size / max(1, records):.1f} "
                  "B each (MEMORY USAGE)")


async def expand(url: str, n: int, per_seed: int) -> None:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    seeds = ExpandedSeeds(SeedRegistry(client, KEYS))
    await expand_lines(seed_lines(n, per_seed), TaskWriter(client, KEYS),
                       ExpandOptions(max_backlog=10 * n), on_error=print, watcher=seeds)
    await seeds.finish()
    await client.aclose()


async def crawl(url: str, history_on: bool) -> int:
    """Every task read and completed as a worker does; how many."""
    client = aioredis.Redis.from_url(url, decode_responses=True)
    consumer = StreamConsumer(client, KEYS, "bench-worker-1")
    history = TaskHistory(client, KEYS, float(DEFAULTS["METEORSEED_TASK_HISTORY_RETENTION"]),
                          int(DEFAULTS["METEORSEED_TASK_HISTORY_PER_SITE"]))
    writer = TaskWriter(client, KEYS)
    await consumer.ensure_group()
    ttl = int(DEFAULTS["METEORSEED_DONE_TTL"])
    done, t_complete, t_history = 0, 0.0, 0.0
    while True:
        batch = await consumer.read(500, 0)
        if not batch:
            break
        records = []
        entries = []
        for d in batch:
            assert d.task is not None
            record = json.dumps({"outcome": "done", "items": 1, "digest": "", "status": 200,
                                 "at": round(time.time(), 3)}, separators=(",", ":"))
            records.append((d.task, record))
            entries.append(HistoryEntry.of(d.task, writer.fingerprint(d.task), "done",
                                           consumer.consumer, items=1, status=200))
        t0 = time.perf_counter()
        await consumer.complete(records, [d.ref for d in batch], ttl)
        t1 = time.perf_counter()
        if history_on:
            await history.write(entries)
        t_history += time.perf_counter() - t1
        t_complete += t1 - t0
        done += len(batch)
    await client.aclose()
    print(f"per task, wall time of batches of 500: completion pipeline (records + ack) "
          f"{t_complete / max(1, done) * 1e6:.1f} us, task history write "
          f"{t_history / max(1, done) * 1e6:.1f} us")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--urls", type=int, default=100_000)
    parser.add_argument("--per-seed", type=int, default=1000)
    parser.add_argument("--sample", type=float, default=0.05,
                        help="share of the keys sized with MEMORY USAGE")
    parser.add_argument("--no-history", action="store_true")
    opts = parser.parse_args()
    n = opts.urls
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        print(f"Redis {client.info('server')['redis_version']}; {n:,} URLs in url_list seeds "
              f"of {opts.per_seed}")
        base = used(client)
        t0 = time.perf_counter()
        asyncio.run(expand(server.url, n, opts.per_seed))
        t1 = time.perf_counter()
        acked = asyncio.run(crawl(server.url, not opts.no_history))
        t2 = time.perf_counter()
        print(f"expanded in {t1 - t0:.1f} s, {acked:,} tasks acked in {t2 - t1:.1f} s")
        report(client, "left at once", base, n, opts.sample)
        for key in client.scan_iter(f"{KEYS.namespace}:done:*", count=5000):
            client.delete(key)  # (as their TTL would)
        report(client, "completion records expired", base, n, opts.sample)
        for key in client.scan_iter(f"{KEYS.namespace}:hist:*", count=5000):
            client.delete(key)  # (as the retention would)
        report(client, "task history expired too", base, n, opts.sample)
        stats = client.memory_stats()
        print("MEMORY STATS (bytes/URL): " + ", ".join(
            f"{k} {float(v) / n:.2f}" for k, v in stats.items()
            if isinstance(v, int) and k not in ("keys.count", "peak.allocated")
            and abs(v) > n / 10))
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

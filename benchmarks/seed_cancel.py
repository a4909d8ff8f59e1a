"""``meteorseed seeds cancel`` among many other seeds' tasks: wall and CPU time of the cancel,
its round trips to Redis, Redis's own time and its longest single command.

    .venv/bin/python benchmarks/seed_cancel.py [--others 200000] [--mine 1000] [--shards 1]
                                               [--rounds 3]

Each round: a throwaway Redis, ``--others`` tasks of 50 other seeds and ``--mine`` of the
cancelled seed enqueued interleaved (``TaskWriter``, spread over 5 sites), a consumer group
that has read none of them, then ``seed_control.cancel`` (what the CLI and the API call). Round
trips are the client's commands (the cancel pipelines nothing); Redis's time is its process's
CPU time (``INFO cpu``); the longest command is the slow log's (every command logged during the
cancel: a script call is one). Every round checks the cancel removed and
counted exactly ``--mine`` tasks. Last line: medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis  # noqa: E402

from meteorseed_scrapy.queue.consume import seed_control  # noqa: E402
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer  # noqa: E402
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter  # noqa: E402
from meteorseed_scrapy.queue.fleet.crawl_progress import read_progress_sync  # noqa: E402
from meteorseed_scrapy.queue.keys import KeyLayout  # noqa: E402
from meteorseed_scrapy.task.exec_task import ExecTask  # noqa: E402
from meteorseed_scrapy.testing.clients import run_with_client  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402

BATCH = 5000


def tasks(others: int, mine: int) -> list[ExecTask]:
    every = max(1, (others + mine) // max(mine, 1))
    out, m = [], 0
    for n in range(others + mine):
        if m < mine and n % every == 0:
            seed, m = "target", m + 1
        else:
            seed = f"other{n % 50}"
        site = f"site{n % 5}"
        out.append(ExecTask.create(seed_id=seed, site_id=site,
                                   url=f"https://{site}.test/{seed}/page/{n}?ref=bench"))
    return out


def one_round(url: str, keys: KeyLayout, others: int, mine: int) -> dict[str, Any]:
    async def fill(client: Any) -> None:
        await StreamConsumer(client, keys, "w1").ensure_group()
        writer, all_tasks = TaskWriter(client, keys), tasks(others, mine)
        for i in range(0, len(all_tasks), BATCH):
            await writer.add(all_tasks[i:i + BATCH], dedup=False)

    run_with_client(url, fill)
    client = redis.Redis.from_url(url, decode_responses=True)
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100000)
    client.slowlog_reset()
    def server_cpu() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    server_s = server_cpu()
    sent = [0]
    execute = client.execute_command

    def counted(*args: Any, **options: Any) -> Any:
        sent[0] += 1
        return execute(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]
    wall, cpu = time.perf_counter(), time.process_time()
    removed = seed_control.cancel(client, keys, "target", "bench")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    client.execute_command = execute  # type: ignore[method-assign]
    server_s = server_cpu() - server_s
    longest = max((e["duration"] for e in client.slowlog_get(100000)), default=0)
    progress = read_progress_sync(client, keys, ["target"])["target"]
    client.close()
    if removed["waiting"] != mine or progress is None or progress["cancelled"] != mine:
        raise SystemExit(f"wrong: removed {removed}, progress {progress}")
    return {"wall": wall, "cpu": cpu, "trips": sent[0], "server": server_s,
            "longest_ms": longest / 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--others", type=int, default=200_000)
    parser.add_argument("--mine", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    got = []
    for n in range(args.rounds):
        with RedisServer() as server:
            r = one_round(server.url, KeyLayout(f"bench{n}", shards=args.shards), args.others,
                          args.mine)
        got.append(r)
        print(f"round {n + 1}: cancel {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU here, "
              f"{r['server']:.2f} s in Redis, {r['trips']} round trips, longest command "
              f"{r['longest_ms']:.1f} ms", flush=True)
    print(f"seeds cancel, {args.mine} of {args.others + args.mine} tasks, {args.shards} "
          f"shard(s): {statistics.median(r['wall'] for r in got):.2f} s wall, "
          f"{statistics.median(r['cpu'] for r in got):.2f} s CPU here, "
          f"{statistics.median(r['server'] for r in got):.2f} s in Redis, "
          f"{statistics.median(r['trips'] for r in got):.0f} round trips, longest command "
          f"{statistics.median(r['longest_ms'] for r in got):.1f} ms (medians of {len(got)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

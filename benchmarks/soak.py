"""Soak: does a worker's cost stay flat as the work grows?

    .venv/bin/python benchmarks/soak.py [--tasks 200000] [--concurrency 16]

``--tasks`` tasks (one ~5 KB page each, ``bench_site.py``) go through two MeteorSeed workers
(``bench_project``, the add-on's set-up, one SQLite store). Three figures, each with its target:

* worker RSS (VmRSS of each worker) once the first 10 % of the tasks are acked and at the end
  (every task acked, before the workers close): they differ by at most 10 %;
* Redis memory (``used_memory`` less the Lua scripts') after the drain against its baseline
  (before anything was enqueued): what is left beyond the baseline is only records that expire
  (completion records, ``METEORSEED_DONE_TTL``) and the dedup root; deleting those brings it
  back to the baseline (within 1 MB: the empty stream, its group and the counters);
* throughput (tasks acked per second) over the last 10 % of the tasks is at least 90 % of
  that over the first 10 %.

Progress is read from Redis (every ack also deletes its entry, so XLEN is what is left). The
last line is the figure.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _crawl_rig import Worker, bench_rig, enqueue_tasks, log_errors, source_label, start_worker

from meteorseed_scrapy.queue.keys import KeyLayout

NAMESPACE = "soak"
POLL = 0.1


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Marks:
    """When each tenth of the tasks was acked, and the workers' RSS then."""

    at: dict[int, float] = field(default_factory=dict)  # tenth -> monotonic time
    rss: dict[int, list[float]] = field(default_factory=dict)  # tenth -> RSS per worker (MB)


def memory_breakdown(client: redis.Redis, keys: KeyLayout) -> dict[str, Any]:
    """Bytes by kind of key: expiring records, the dedup root, everything else."""
    out: dict[str, Any] = {"expiring": 0, "dedup": 0, "other": 0, "expiring_keys": 0,
                           "other_keys": []}
    seen_prefix = keys.seen("bench")
    for key in client.scan_iter(match=f"{keys.namespace}*", count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        size = int(client.memory_usage(name) or 0)
        if name.startswith(seen_prefix):
            out["dedup"] += size
        elif int(client.ttl(name)) > 0:
            out["expiring"] += size
            out["expiring_keys"] += 1
        else:
            out["other"] += size
            out["other_keys"].append(name)
    return out


def final_stats(worker: Worker) -> dict[str, int]:
    """The meteorseed/* counters of the worker's final stats dump (in its log)."""
    dump = worker.log().rpartition("Dumping Scrapy stats:")[2]
    return {k: int(v) for k, v in re.findall(r"'(meteorseed/[a-z_/]+)': (\d+)\b", dump)}


def used_memory(client: redis.Redis) -> int:
    """``used_memory`` less the Lua scripts' (loaded once, at the first use of each script)."""
    info = client.info("memory")
    return int(info["used_memory"]) - int(info.get("used_memory_lua", 0)) \
        - int(info.get("used_memory_scripts", 0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=16, help="CONCURRENT_REQUESTS")
    parser.add_argument("--keep", metavar="DIR", help="keep logs and the SQLite file here")
    args = parser.parse_args(argv)
    n = args.tasks
    keys = KeyLayout(NAMESPACE)

    with bench_rig(args.keep, "meteorseed-soak-") as (workdir, server, site):
        print(source_label(), flush=True)
        print(f"{n} tasks, 2 workers x CONCURRENT_REQUESTS={args.concurrency}; work dir "
              f"{workdir}", flush=True)
        client = redis.Redis.from_url(server.url)
        client.flushall()
        baseline = used_memory(client)
        for start in range(0, n, 20_000):
            urls = [f"{site.url}/item/{i}" for i in range(start, min(n, start + 20_000))]
            if enqueue_tasks(server.url, NAMESPACE, urls) != len(urls):
                raise RuntimeError("not every task was enqueued")
        loaded = used_memory(client)
        settings = {
            "METEORSEED_REDIS_URL": server.url, "METEORSEED_NAMESPACE": NAMESPACE,
            "METEORSEED_STORE_URI": f"sqlite:///{workdir / 'items.db'}",
            "METEORSEED_IDLE_CLOSE": 3, "CONCURRENT_REQUESTS": args.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": args.concurrency,
            "METEORSEED_SITE_CONCURRENCY": 2 * args.concurrency,
            "LOGSTATS_INTERVAL": 600,
            # The bench project's timing extension keeps a timestamp per response and per item
            # (a timeline for throughput.py): 64 B a task that are not the worker's.
            "EXTENSIONS": {"bench.timing.Timing": None},
        }
        workers: list[Worker] = [
            start_worker(workdir, name, "bench", "bench.settings_meteorseed",
                         {**settings, "METEORSEED_CONSUMER": name})
            for name in ("w1", "w2")
        ]
        marks = Marks()
        t0 = time.monotonic()
        first_ack: float | None = None  # process start-up before it is not counted
        try:
            while True:
                left = int(client.xlen(keys.stream))
                done = n - left
                if done and first_ack is None:
                    first_ack = time.monotonic()
                tenth = done * 10 // n
                for t in range(1, tenth + 1):
                    if t not in marks.at:
                        marks.at[t] = time.monotonic()
                        marks.rss[t] = [rss_mb(w.proc.pid) for w in workers]
                        print(f"{t * 10:3d} % acked after {marks.at[t] - t0:7.1f} s; worker "
                              f"RSS {', '.join(f'{r:.1f}' for r in marks.rss[t])} MB",
                              flush=True)
                if done >= n:
                    break
                for w in workers:
                    if w.proc.poll() is not None:
                        raise RuntimeError(f"worker {w.proc.args} exited early:\n"
                                           + w.log()[-3000:])
                time.sleep(POLL)
            for w in workers:
                if w.wait(300) != 0 or log_errors(w):
                    raise RuntimeError(f"a worker failed: {log_errors(w)[:5]}\n"
                                       + w.log()[-3000:])
        finally:
            for w in workers:
                if w.proc.poll() is None:
                    w.kill()
        stats = [final_stats(w) for w in workers]
        drained = used_memory(client)
        parts = memory_breakdown(client, keys)
        expiring = [k for k in client.scan_iter(match=f"{NAMESPACE}*", count=1000)
                    if int(client.ttl(k)) > 0 or k.decode().startswith(keys.seen("bench"))]
        for i in range(0, len(expiring), 1000):
            client.delete(*expiring[i:i + 1000])
        # Redis shrinks its key table in its cron, a little after the keys went.
        time.sleep(2)
        cleaned = used_memory(client)
        pending = client.xpending(keys.stream, keys.group)["pending"]

    assert first_ack is not None
    first = n / 10 / (marks.at[1] - first_ack)
    last = n / 10 / (marks.at[10] - marks.at[9])
    rss10, rss_end = marks.rss[1], marks.rss[10]
    growth = [(b - a) / a for a, b in zip(rss10, rss_end, strict=True)]
    acked = sum(int(s.get("meteorseed/acked", 0)) for s in stats)
    print()
    print(f"acked {acked}/{n}, pending {pending}; per worker acked "
          + ", ".join(str(s.get("meteorseed/acked", 0)) for s in stats)
          + "; reclaimed " + ", ".join(str(s.get("meteorseed/reclaimed", 0)) for s in stats))
    print(f"throughput: first 10 % {first:.1f} tasks/s (after the first ack), tenths "
          + ", ".join(f"{n / 10 / (marks.at[t] - marks.at[t - 1]):.0f}" for t in range(2, 11))
          + f" tasks/s; last 10 % {last:.1f} tasks/s = {last / first:.2f}x the first")
    print(f"worker RSS at 10 %: {', '.join(f'{r:.1f}' for r in rss10)} MB; at the end: "
          f"{', '.join(f'{r:.1f}' for r in rss_end)} MB ("
          + ", ".join(f"{g:+.1%}" for g in growth) + ")")
    mb = 1024 * 1024
    print(f"Redis used_memory: baseline {baseline / mb:.1f} MB, {n} tasks waiting "
          f"{loaded / mb:.1f} MB, after the drain {drained / mb:.1f} MB = baseline + "
          f"{parts['expiring'] / mb:.1f} MB expiring records ({parts['expiring_keys']} keys) + "
          f"{parts['dedup'] / mb:.1f} MB dedup root + {parts['other'] / mb:.2f} MB other "
          f"({', '.join(parts['other_keys'])}); with the expiring and dedup records deleted "
          f"{cleaned / mb:.2f} MB ({(cleaned - baseline) / 1024:+.0f} KB vs baseline)")
    ok_rss = all(abs(g) <= 0.10 for g in growth)
    ok_redis = cleaned - baseline <= mb
    ok_rate = last >= 0.9 * first
    print(f"soak {n} tasks, 2 workers: RSS end vs 10 % "
          + ", ".join(f"{g:+.1%}" for g in growth) + f" ({'ok' if ok_rss else 'MISSED'} <= 10 %);"
          f" Redis after drain minus expiring/dedup records {(cleaned - baseline) / 1024:+.0f} KB"
          f" vs baseline ({'ok' if ok_redis else 'MISSED'}); last/first 10 % throughput "
          f"{last / first:.2f}x ({'ok' if ok_rate else 'MISSED'} >= 0.90)")


if __name__ == "__main__":
    main()

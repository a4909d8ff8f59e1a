"""Throughput of one worker: stock Scrapy vs MeteorSeed's full path vs scrapy-redis 0.9.1.

    .venv/bin/python benchmarks/throughput.py [--rounds 5] [--pages 2000]

The same spider (``bench_project``: one item per ~5 KB detail page, no link following), the same
local site (``bench_site.py``, its own process), CONCURRENT_REQUESTS=16 (and 16 per slot),
LOG_LEVEL INFO, for:

* stock: Scrapy's default scheduler, URLs read from a file in ``start()``, a JSON Lines feed;
* meteorseed: the add-on's default set-up (StreamScheduler, ack after commit, UpsertPipeline to
  SQLite in a temp dir); tasks enqueued beforehand with TaskWriter (not timed);
  METEORSEED_IDLE_CLOSE=1;
* scrapy-redis: its scheduler and dupefilter, a RedisSpider reading ``bench_redis:start_urls``,
  the same JSON Lines feed; closes at CLOSESPIDER_ITEMCOUNT=N (or after 1 s idle).

A run is timed from its first response to its last committed item (``item_scraped``, which for
MeteorSeed fires only after the store commit), never process start-up. The machine is shared
and noisy, so the contenders run one after another within a round, in a rotating order, and
the figure is the median over rounds of per-round throughput ratios. CPU seconds used by the
worker process in the same window are reported too (less sensitive to noise than wall time).
The last line is the figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _crawl_rig import (
    Worker,
    bench_rig,
    enqueue_tasks,
    log_errors,
    median,
    source_label,
    start_worker,
)

CONTENDERS = ("stock", "meteorseed", "scrapy-redis")
LABEL = {"stock": "stock", "meteorseed": "meteorseed", "scrapy-redis": "scrapy-redis"}


@dataclass
class Run:
    contender: str
    round: int
    seconds: float
    cpu_seconds: float
    items: int
    stats: dict[str, Any]
    #: response_received -> item_scraped of each page, ms (Scrapy's own signals: every contender)
    item_latency_ms: list[float]
    #: meteorseed with --stages: step -> [p50, p95] ms (bench/ack_stages.py)
    stages: dict[str, Any] | None = None

    def pages_per_s(self, pages: int) -> float:
        return pages / self.seconds


def run_one(contender: str, rnd: int, pages: int, urls_file: Path, urls: list[str],
            redis_url: str, workdir: Path, timeout: float, wrapper: list[str],
            overrides: dict[str, str], stages: bool = False) -> Run:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    rundir = workdir / f"r{rnd}-{contender}"
    rundir.mkdir()
    feed = rundir / "items.jsonl"
    worker: Worker
    prof = [*wrapper, str(rundir / "profile.txt"), "--"] if wrapper else []
    if contender == "stock":
        worker = start_worker(
            rundir, "w", "bench", "bench.settings_stock",
            {"FEEDS": {str(feed): {"format": "jsonlines"}}},
            spider_args={"urls_file": str(urls_file)}, wrapper=prof,
        )
    elif contender == "meteorseed":
        namespace = f"bench{rnd}"
        enqueued = enqueue_tasks(redis_url, namespace, urls)
        if enqueued != pages:
            raise RuntimeError(f"enqueued {enqueued} tasks, expected {pages}")
        worker = start_worker(
            rundir, "w", "bench", "bench.settings_meteorseed",
            {
                "METEORSEED_REDIS_URL": redis_url,
                "METEORSEED_NAMESPACE": namespace,
                "METEORSEED_STORE_URI": f"sqlite:///{rundir / 'items.db'}",
                "METEORSEED_CONSUMER": "bench-w1",
                "METEORSEED_IDLE_CLOSE": 1,
                **({"BENCH_STAGES_FILE": str(rundir / "stages.json")} if stages else {}),
                **overrides,
            },
            wrapper=prof,
        )
    else:
        key = "bench_redis:start_urls"
        pipe = client.pipeline(transaction=False)
        for i in range(0, len(urls), 1000):
            pipe.rpush(key, *(f'{{"url": "{u}"}}' for u in urls[i : i + 1000]))
        pipe.execute()
        worker = start_worker(
            rundir, "w", "bench_redis", "bench.settings_scrapy_redis",
            {
                "REDIS_URL": redis_url,
                "FEEDS": {str(feed): {"format": "jsonlines"}},
                "MAX_IDLE_TIME_BEFORE_CLOSE": 1,
                "CLOSESPIDER_ITEMCOUNT": pages,
            },
            wrapper=prof,
        )
    client.close()
    code = worker.wait(timeout)
    timing = worker.timing()
    errors = log_errors(worker)
    if code != 0 or errors:
        raise RuntimeError(f"{contender} run {rnd} failed (exit {code}): {errors[:5]}\n"
                           + worker.log()[-3000:])
    stats = timing["stats"]
    if contender == "meteorseed":
        with sqlite3.connect(rundir / "items.db") as conn:
            stored = int(conn.execute("SELECT COUNT(*) FROM items").fetchone()[0])
        acked = int(stats.get("meteorseed/acked", 0))
        if stored != pages or acked != pages:
            raise RuntimeError(f"meteorseed run {rnd}: stored {stored}, acked {acked} of {pages}")
    else:
        stored = sum(1 for line in feed.read_text().splitlines() if line.strip())
        if stored != pages:
            raise RuntimeError(f"{contender} run {rnd}: {stored} items in the feed of {pages}")
    if timing["items"] != pages:
        raise RuntimeError(f"{contender} run {rnd}: item_scraped {timing['items']} times")
    return Run(
        contender, rnd,
        seconds=timing["last_item"] - timing["first_response"],
        cpu_seconds=timing["cpu_last_item"] - timing["cpu_first_response"],
        items=stored, stats=stats, item_latency_ms=timing.get("item_latency_ms", []),
        stages=(json.loads((rundir / "stages.json").read_text())
                if stages and contender == "meteorseed" else None),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--only", default=",".join(CONTENDERS),
                        help="comma-separated contenders (stock must be among them for ratios)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a Scrapy setting for the meteorseed runs (repeatable)")
    parser.add_argument("--keep", metavar="DIR", help="keep logs, feeds and SQLite files here")
    parser.add_argument("--delay-ms", dest="delay_ms", type=int, default=0,
                        help="the site answers each page after this many milliseconds (0: at "
                             "once, the worker's core saturated; e.g. 100: the core mostly "
                             "idle, so latencies are the path's own, not queueing)")
    parser.add_argument("--stages", action="store_true",
                        help="time each step from response to ack of every meteorseed task "
                             "(bench/ack_stages.py) and print their p50/p95")
    parser.add_argument("--py-spy", dest="py_spy", action="store_true",
                        help="profile every run with `py-spy record` (raw stacks in the run "
                             "directory; slows the runs, so ratios then mean little)")
    args = parser.parse_args(argv)
    contenders = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown or not contenders:
        parser.error(f"--only: pick among {', '.join(CONTENDERS)}")
    overrides = dict(kv.split("=", 1) for kv in args.extra)
    wrapper: list[str] = []
    if args.py_spy:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        wrapper = [spy, "record", "--format", "raw", "--rate", "200", "--subprocesses",
                   "--threads", "--output"]

    runs: list[Run] = []
    with bench_rig(args.keep, "meteorseed-bench-", linger=0.2) as (workdir, server, site):
        query = f"?delay={args.delay_ms}" if args.delay_ms > 0 else ""
        urls = [f"{site.url}/item/{i}{query}" for i in range(args.pages)]
        urls_file = workdir / "urls.txt"
        urls_file.write_text("\n".join(urls) + "\n")
        print(source_label(), flush=True)
        print(f"{args.pages} pages of ~5 KB from {site.url}, Redis {server.url}, "
              f"CONCURRENT_REQUESTS=16, site delay {args.delay_ms} ms, {args.rounds} rounds; "
              f"work dir {workdir}",
              flush=True)
        for rnd in range(1, args.rounds + 1):
            shift = (rnd - 1) % len(contenders)
            order = contenders[shift:] + contenders[:shift]
            for contender in order:
                run = run_one(contender, rnd, args.pages, urls_file, urls, server.url,
                              workdir, args.timeout, wrapper, overrides, args.stages)
                runs.append(run)
                lat = sorted(run.item_latency_ms) or [float("nan")]
                extra = (f"  response->item p50 {lat[len(lat) // 2]:.1f} ms, "
                         f"p95 {lat[int(len(lat) * 0.95)]:.1f} ms")
                if contender == "meteorseed":
                    p50 = run.stats.get("meteorseed/ack_latency_ms/p50")
                    p95 = run.stats.get("meteorseed/ack_latency_ms/p95")
                    extra += f"; response->ack p50 {p50} ms, p95 {p95} ms"
                print(f"round {rnd} {LABEL[contender]:<12} {run.seconds:7.2f} s "
                      f"{run.pages_per_s(args.pages):7.1f} pages/s  "
                      f"cpu {run.cpu_seconds:6.2f} s "
                      f"({1000 * run.cpu_seconds / args.pages:.2f} ms/page){extra}",
                      flush=True)

    by = {(r.contender, r.round): r for r in runs}
    rounds = range(1, args.rounds + 1)
    print()
    staged = [by["meteorseed", r].stages for r in rounds if ("meteorseed", r) in by]
    if args.stages and staged and all(staged):
        print("meteorseed response -> ack, step by step (p50 / p95 ms, median over rounds; "
              f"{', '.join(str(st['tasks']) for st in staged if st)} tasks timed):")
        for step in [k for k in staged[0] if k != "tasks"]:  # type: ignore[union-attr]
            p50 = median([st[step][0] for st in staged if st and step in st])
            p95 = median([st[step][1] for st in staged if st and step in st])
            print(f"  {step:<26} {p50:6.1f} / {p95:6.1f}")
    summary: list[str] = []
    for contender in contenders:
        pps = [by[contender, r].pages_per_s(args.pages) for r in rounds]
        print(f"{LABEL[contender]:<12} pages/s per round: "
              + ", ".join(f"{v:.1f}" for v in pps) + f"  (median {median(pps):.1f})")
    if "stock" in contenders:
        for contender in contenders:
            if contender == "stock":
                continue
            ratios = [by["stock", r].seconds / by[contender, r].seconds for r in rounds]
            cpu = [by[contender, r].cpu_seconds / by["stock", r].cpu_seconds for r in rounds]
            print(f"{LABEL[contender]} / stock throughput per round: "
                  + ", ".join(f"{v:.2f}" for v in ratios) + f"  (median {median(ratios):.2f}x);"
                  f" CPU per page {median(cpu):.2f}x stock")
            name = "full path" if contender == "meteorseed" else LABEL[contender]
            summary.append(f"{name} / stock: {median(ratios):.2f}x")
    for contender in contenders:
        cuts = [sorted(by[contender, r].item_latency_ms) or [float("nan")] for r in rounds]
        p50s = [c[len(c) // 2] for c in cuts]
        p95s = [c[int(len(c) * 0.95)] for c in cuts]
        print(f"{LABEL[contender]:<12} response -> item_scraped p50 per round: "
              + ", ".join(f"{v:.1f}" for v in p50s) + " ms; p95: "
              + ", ".join(f"{v:.1f}" for v in p95s) + " ms")
        if contender == "stock":
            summary.append(f"stock Scrapy response -> item p50 {median(p50s):.0f} ms "
                           f"(p95 {median(p95s):.0f} ms)")
    if "meteorseed" in contenders:
        p50 = [float(by["meteorseed", r].stats.get("meteorseed/ack_latency_ms/p50", "nan"))
               for r in rounds]
        p95 = [float(by["meteorseed", r].stats.get("meteorseed/ack_latency_ms/p95", "nan"))
               for r in rounds]
        print("meteorseed ack latency (response -> XACK) p50 per round: "
              + ", ".join(f"{v:.1f}" for v in p50) + " ms; p95: "
              + ", ".join(f"{v:.1f}" for v in p95) + " ms")
        summary.append(f"meteorseed ack latency p50 {median(p50):.0f} ms "
                       f"(p95 {median(p95):.0f} ms) at 16 concurrent")
    if summary:
        head, *rest = summary
        print(f"{head} (median of {args.rounds} alternating rounds, {args.pages} pages); "
              + "; ".join(rest))


if __name__ == "__main__":
    main()

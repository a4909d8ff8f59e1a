"""Scale-out on simulated hosts: 1, 2 and 4 worker hosts crawl the same tasks.

    sudo .venv/bin/python benchmarks/scale_out.py [--tasks 1200] [--delay-ms 100]
        [--per-worker 4] [--rounds 1] [--hosts 1,2,4]

Every worker is a real ``scrapy crawl probe`` (tests/e2e_project) in a network namespace of its
own; Redis and the site (:class:`meteorseed_scrapy.testing.netns.MeteredSite`, pages that take
``--delay-ms`` each: latency-bound, not CPU-bound) are hosts of their own. The workers start
first and the tasks are enqueued once every one of them reads the stream, so start-up is not
timed. The time is the site's, from the first request to the last; each worker fetches at most
``--per-worker`` pages at once (CONCURRENT_REQUESTS), so n hosts can at best go n times as fast.
The per-site cap and quota are set far above that (they must not be what limits), then one
more 4-host run with a binding cap (``--cap``, ``--rate``) shows the site never saw more in
flight, or more begun in one second, than allowed. Rounds alternate the order of the host
counts; the ratios are the medians. Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.metered_site import meter
from meteorseed_scrapy.testing.netns import Fleet, unavailable
from meteorseed_scrapy.testing.polling import wait_for

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "tests" / "e2e_project"
NS = "scale"


def _enqueue(redis_url: str, urls: list[str]) -> None:
    tasks = [ExecTask.create(seed_id="s1", site_id="probe", url=u) for u in urls]

    async def run() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            await TaskWriter(client, KeyLayout(NS)).add(tasks, dedup=True)
        finally:
            await client.aclose()

    asyncio.run(run())


def crawl(hosts: int, args: argparse.Namespace, cap: int, rate: float) -> dict[str, Any]:
    """One crawl of ``args.tasks`` pages by ``hosts`` worker hosts; the site's measures."""
    with Fleet(workers=hosts) as fleet:
        redis_url, site = fleet.start_redis(), fleet.start_site()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(PROJECT)]))
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        settings = {"METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": NS,
                    "METEORSEED_STORE_URI": f"sqlite:///{fleet.workdir / 'items.db'}",
                    "METEORSEED_IDLE_CLOSE": 6, "CONCURRENT_REQUESTS": args.per_worker,
                    "METEORSEED_SITE_CONCURRENCY": cap, "METEORSEED_SITE_RATE": rate,
                    "METEORSEED_SITE_BURST": max(1, int(rate / 10)), "LOG_LEVEL": "INFO"}
        logs, procs = [], []
        for name in fleet.workers:
            argv = [sys.executable, "-m", "scrapy.cmdline", "crawl", "probe"]
            for key, value in {**settings, "METEORSEED_CONSUMER": name,
                               "LOG_FILE": fleet.workdir / f"{name}.log"}.items():
                argv += ["-s", f"{key}={value}"]
            logs.append(fleet.workdir / f"{name}.log")
            procs.append(fleet.spawn(name, argv, env=env, cwd=PROJECT))
        wait_for(lambda: all(p.exists() and "StreamScheduler reading" in p.read_text()
                             for p in logs), 120)
        _enqueue(redis_url, [f"{site}/slow/{args.delay_ms}?i={i}" for i in range(args.tasks)])
        for proc in procs:
            if proc.wait(600) != 0:
                raise SystemExit(f"a worker failed; see {fleet.workdir}")
        measures = meter(site)
    if measures["requests"] < args.tasks:
        raise SystemExit(f"{hosts} host(s): the site saw {measures['requests']} requests, "
                         f"fewer than {args.tasks} tasks")
    measures["seconds"] = measures["last"] - measures["first"] + args.delay_ms / 1000
    return measures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1200)
    parser.add_argument("--delay-ms", type=int, default=100)
    parser.add_argument("--per-worker", type=int, default=4, help="CONCURRENT_REQUESTS")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--hosts", default="1,2,4")
    parser.add_argument("--cap", type=int, default=6, help="binding per-site concurrency")
    parser.add_argument("--rate", type=float, default=30.0, help="binding per-site rate/s")
    args = parser.parse_args()
    why = unavailable()
    if why:
        raise SystemExit(f"cannot build simulated hosts here: {why}")
    counts = [int(h) for h in args.hosts.split(",")]
    seconds: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(args.rounds):
        for n in counts if r % 2 == 0 else counts[::-1]:
            m = crawl(n, args, cap=1000, rate=10_000.0)
            seconds[n].append(m["seconds"])
            print(f"round {r + 1}: {n} host(s): {m['seconds']:.2f}s at the site, "
                  f"{args.tasks / m['seconds']:.0f} pages/s, max in flight {m['max_in_flight']} "
                  f"(of {n * args.per_worker} slots), max begun in 1 s {m['max_per_second']}",
                  flush=True)
    base = statistics.median(seconds[counts[0]])
    for n in counts[1:]:
        ratio = base / statistics.median(seconds[n])
        print(f"{n} hosts / {counts[0]}: {ratio:.2f}x (ideal {n / counts[0]:.0f}x)")
    m = crawl(max(counts), args, cap=args.cap, rate=args.rate)
    burst = max(1, int(args.rate / 10))
    print(f"capped, {max(counts)} hosts: site max in flight {m['max_in_flight']} (cap "
          f"{args.cap}), max begun in 1 s {m['max_per_second']} (rate {args.rate:g}/s + burst "
          f"{burst}), mean {args.tasks / m['seconds']:.1f}/s")
    if m["max_in_flight"] > args.cap or m["max_per_second"] > args.rate + burst:
        raise SystemExit("the per-site cap or quota was exceeded")


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"({time.monotonic() - started:.0f}s)")

"""Throughput of one MeteorSeed worker with the Prometheus endpoint on vs off.

    .venv/bin/python benchmarks/metrics_overhead.py [--rounds 6] [--pages 2000]

The set-up of ``throughput.py`` (bench project, local ~5 KB pages, CONCURRENT_REQUESTS=16,
SQLite store, tasks enqueued beforehand and not timed), run twice per round:

* off: ``METEORSEED_METRICS_PORT`` unset (the extension is not loaded);
* on: ``METEORSEED_METRICS_PORT`` set, the queue sampled every ``--interval`` seconds (default
  1, five times the default), and ``/metrics`` scraped every ``--scrape`` seconds (default 1)
  by a thread of this script for the whole run, as Prometheus would (more often than its usual
  15 s).

A run is timed from its first response to its last committed item. The two runs of a round go
one after the other in alternating order; the figure is the median over rounds of
``on seconds / off seconds - 1``. The last line is the figure.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _crawl_rig import BenchSite, enqueue_tasks, log_errors, median, source_label, start_worker

from meteorseed_scrapy.testing.redis_server import RedisServer, free_port


class Scraper(threading.Thread):
    """Polls ``/metrics`` until stopped; counts the answers that named the task counter."""

    def __init__(self, port: int, every: float) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.every = every
        self.ok = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as reply:
                    self.ok += b"meteorseed_tasks_total" in reply.read()
            except OSError:
                pass  # not listening yet, or gone already


def run_one(mode: str, rnd: int, urls: list[str], redis_url: str, workdir: Path,
            args: argparse.Namespace) -> tuple[float, float, int]:
    """(seconds, CPU seconds, successful scrapes) of one run."""
    rundir = workdir / f"r{rnd}-{mode}"
    rundir.mkdir()
    namespace = f"bench{rnd}{mode}"
    if enqueue_tasks(redis_url, namespace, urls) != len(urls):
        raise RuntimeError("tasks not enqueued")
    settings = {
        "METEORSEED_REDIS_URL": redis_url,
        "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_STORE_URI": f"sqlite:///{rundir / 'items.db'}",
        "METEORSEED_CONSUMER": "bench-w1",
        "METEORSEED_IDLE_CLOSE": 1,
    }
    scraper: Scraper | None = None
    if mode == "on":
        port = free_port()
        settings.update(METEORSEED_METRICS_PORT=port, METEORSEED_METRICS_INTERVAL=args.interval)
        scraper = Scraper(port, args.scrape)
    worker = start_worker(rundir, "w", "bench", "bench.settings_meteorseed", settings)
    if scraper is not None:
        scraper.start()
    try:
        code = worker.wait(args.timeout)
    finally:
        if scraper is not None:
            scraper.stop.set()
            scraper.join()
    errors = log_errors(worker)
    if code != 0 or errors:
        raise RuntimeError(f"{mode} run {rnd} failed (exit {code}): {errors[:5]}")
    with sqlite3.connect(rundir / "items.db") as conn:
        stored = int(conn.execute("SELECT COUNT(*) FROM items").fetchone()[0])
    timing = worker.timing()
    if stored != len(urls) or timing["items"] != len(urls):
        raise RuntimeError(f"{mode} run {rnd}: stored {stored} of {len(urls)}")
    if scraper is not None and not scraper.ok:
        raise RuntimeError(f"run {rnd}: the metrics endpoint never answered")
    return (timing["last_item"] - timing["first_response"],
            timing["cpu_last_item"] - timing["cpu_first_response"],
            scraper.ok if scraper else 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=1.0, help="queue sampling, seconds")
    parser.add_argument("--scrape", type=float, default=1.0, help="GET /metrics every N s")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="meteorseed-metrics-bench-"))
    results: dict[tuple[str, int], tuple[float, float, int]] = {}
    try:
        with RedisServer() as server, BenchSite() as site:
            urls = [f"{site.url}/item/{i}" for i in range(args.pages)]
            print(source_label(), flush=True)
            print(f"{args.pages} pages from {site.url}, {args.rounds} rounds, queue sampled "
                  f"every {args.interval} s, /metrics scraped every {args.scrape} s", flush=True)
            for rnd in range(1, args.rounds + 1):
                order = ("off", "on") if rnd % 2 else ("on", "off")
                for mode in order:
                    seconds, cpu_s, scrapes = run_one(mode, rnd, urls, server.url, workdir, args)
                    results[mode, rnd] = (seconds, cpu_s, scrapes)
                    print(f"round {rnd} metrics {mode:<3} {seconds:6.2f} s "
                          f"{args.pages / seconds:7.1f} pages/s  cpu {cpu_s:6.2f} s"
                          + (f"  ({scrapes} scrapes)" if mode == "on" else ""), flush=True)
    finally:
        time.sleep(0.2)
        shutil.rmtree(workdir, ignore_errors=True)
    rounds = range(1, args.rounds + 1)
    overhead = [100 * (results["on", r][0] / results["off", r][0] - 1) for r in rounds]
    cpu = [100 * (results["on", r][1] / results["off", r][1] - 1) for r in rounds]
    print()
    print("wall-time overhead per round: " + ", ".join(f"{v:+.1f} %" for v in overhead))
    print("CPU overhead per round: " + ", ".join(f"{v:+.1f} %" for v in cpu)
          + f"  (median {median(cpu):+.1f} %)")
    print(f"metrics endpoint overhead: {median(overhead):.1f} % (goal ≤ 2 %)")


if __name__ == "__main__":
    main()

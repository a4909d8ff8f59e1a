"""Fleet-wide adaptive politeness (issue 15), measured at the server with real workers.

    .venv/bin/python benchmarks/adaptive.py {inflight,slowdown,crawl-delay,all} [--rounds N]

A :class:`LoadSite` in this process answers each request in ``50 ms + 25 ms per request
already in flight`` and records when each arrived and left; ``scrapy crawl probe`` workers of
``tests/e2e_project`` (the add-on; 16 requests per worker and per slot, the site's configured
rate and concurrency lifted) crawl tasks of one site, from a throwaway Redis
(``politeness_harness.Bench``). The figures are the last lines.

* ``inflight``: 4 workers, ``AUTOTHROTTLE_ENABLED``, ``AUTOTHROTTLE_TARGET_CONCURRENCY`` 2,
  start delay 0.5 s. Fleet: the add-on hands AutoThrottle over to the fleet-wide limit. Scrapy:
  ``METEORSEED_ADAPTIVE=False`` keeps Scrapy's per-process AutoThrottle in each worker. Rounds
  alternate the two; the figure is the median of the time-averaged requests in flight at the
  server between the arrival of the 25th and the 90th percent of the tasks. Goal: fleet within
  ±15 % of 2 (Scrapy's: about 4 x 2).
* ``slowdown``: the same fleet; 15 s after the crawl starts the site's latency is multiplied by
  4 for 30 s. Server-side rate in 1 s windows: seconds from the slowdown to the first window at
  or below half the rate before it (goal ≤ 10 s), seconds from its end to the first window back
  at 80 % of it (goal ≤ 30 s); tasks stored and dead letters (goal all, 0).
* ``crawl-delay``: robots.txt ``Crawl-delay: 0.5``, ``ROBOTSTXT_OBEY``, 4 workers, no adaptive
  limit: server-side rate from the first to the last arrival. Goal ≤ 2.0 req/s (+2 %).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from politeness_harness import Bench, wait_until, window_rates

from meteorseed_scrapy.testing.load_site import LoadSite

SITE_ID = "load"
TARGET = 2
ADAPTIVE: dict[str, Any] = {
    "AUTOTHROTTLE_ENABLED": True,
    "AUTOTHROTTLE_TARGET_CONCURRENCY": TARGET,
    "AUTOTHROTTLE_START_DELAY": 0.5,
    "METEORSEED_SITE_RATE": 1000,
    "METEORSEED_SITE_BURST": 1000,
    "METEORSEED_SITE_CONCURRENCY": 100,
}
SCRAPY = {**ADAPTIVE, "METEORSEED_ADAPTIVE": False}


def crawl(label: str, site: LoadSite, n: int, settings: dict[str, Any], keep: bool,
          during: Any = None) -> tuple[Bench, list[float]]:
    """``n`` tasks of the site crawled by 4 workers; ``during(bench)`` runs while they crawl."""
    with Bench(label, keep=keep, site=cast(Any, site)) as bench:
        bench.enqueue([f"{site.url}/p/{i}" for i in range(n)], site_id=SITE_ID)
        bench.workers(4, **settings)
        if during is not None:
            during(bench)
        bench.wait_workers(600)
        bench.stored_n = bench.stored()  # type: ignore[attr-defined]
        bench.dead_n = bench.dead()  # type: ignore[attr-defined]
    return bench, sorted(site.arrivals())


def in_flight_round(fleet: bool, n: int, keep: bool) -> float:
    site = LoadSite(base_ms=50, per_request_ms=25)
    _, arrivals = crawl("fleet" if fleet else "scrapy", site, n, ADAPTIVE if fleet else SCRAPY,
                        keep)
    start, end = arrivals[len(arrivals) // 4], arrivals[len(arrivals) * 9 // 10]
    return site.in_flight(start, end)


def bench_inflight(args: argparse.Namespace) -> list[str]:
    fleet: list[float] = []
    scrapy: list[float] = []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for is_fleet in order:
            value = in_flight_round(is_fleet, args.tasks, args.keep)
            (fleet if is_fleet else scrapy).append(value)
            print(f"round {r + 1}: {'fleet ' if is_fleet else 'scrapy'} in flight "
                  f"{value:.2f}", flush=True)
    f, s = statistics.median(fleet), statistics.median(scrapy)
    return [f"inflight: fleet-wide {f:.2f} requests in flight at the server (target {TARGET},"
            f" {100 * (f - TARGET) / TARGET:+.0f} %, goal ±15 %); Scrapy's per-process "
            f"AutoThrottle in 4 workers {s:.2f} ({s / f:.1f}x); median of {len(fleet)} "
            f"alternating rounds"]


def bench_slowdown(args: argparse.Namespace) -> list[str]:
    site = LoadSite(base_ms=50, per_request_ms=25)
    marks: dict[str, float] = {}

    def slow_down(bench: Bench) -> None:
        wait_until(lambda: site.served() > 0, 60)
        first = site.arrivals()[0]
        wait_until(lambda: time.monotonic() >= first + 15, 30)
        marks["slow"] = time.monotonic()
        site.slowdown = 4.0
        wait_until(lambda: time.monotonic() >= marks["slow"] + 30, 40)
        site.slowdown = 1.0
        marks["fast"] = time.monotonic()

    bench, arrivals = crawl("slowdown", site, args.slow_tasks, ADAPTIVE, args.keep, slow_down)
    rates = window_rates(arrivals, 1.0)
    first = arrivals[0]
    slow_at, fast_at = int(marks["slow"] - first), int(marks["fast"] - first)
    before = statistics.median(rates[max(0, slow_at - 6):slow_at])
    during = statistics.median(rates[slow_at + 10:fast_at])
    fell = next((i - slow_at for i in range(slow_at, len(rates))
                 if rates[i] <= before / 2), None)
    back = next((i - fast_at for i in range(fast_at, len(rates))
                 if rates[i] >= 0.8 * before), None)
    stored, dead = bench.stored_n, bench.dead_n  # type: ignore[attr-defined]
    return [f"slowdown: {before:.1f} req/s before, {during:.1f} while 4x slower; the rate fell"
            f" to half within {fell} s (goal <= 10) and was back at 80 % {back} s after"
            f" (goal <= 30); {stored}/{args.slow_tasks} stored, {dead} dead letters"]


def bench_crawl_delay(args: argparse.Namespace) -> list[str]:
    rates = []
    for r in range(args.rounds):
        site = LoadSite(base_ms=5, per_request_ms=0, robots="User-agent: *\nCrawl-delay: 0.5\n")
        _, arrivals = crawl("crawl-delay", site, args.delay_tasks,
                            {"ROBOTSTXT_OBEY": True, "METEORSEED_SITE_RATE": 1000,
                             "METEORSEED_SITE_BURST": 1000, "METEORSEED_SITE_CONCURRENCY": 100},
                            args.keep)
        rates.append((len(arrivals) - 1) / (arrivals[-1] - arrivals[0]))
        print(f"round {r + 1}: {rates[-1]:.3f} req/s", flush=True)
    return [f"crawl-delay: robots.txt Crawl-delay 0.5, 4 workers, configured 1000 req/s: "
            f"{max(rates):.3f} req/s at the server at most over {len(rates)} rounds "
            f"(median {statistics.median(rates):.3f}; goal <= 2.04)"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", choices=("inflight", "slowdown", "crawl-delay", "all"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=500, help="tasks per inflight round")
    parser.add_argument("--slow-tasks", type=int, default=1000)
    parser.add_argument("--delay-tasks", type=int, default=40)
    parser.add_argument("--keep", action="store_true", help="keep the worker logs")
    args = parser.parse_args(argv)
    benches = {"inflight": bench_inflight, "slowdown": bench_slowdown,
               "crawl-delay": bench_crawl_delay}
    chosen = list(benches) if args.bench == "all" else [args.bench]
    lines = [line for name in chosen for line in benches[name](args)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

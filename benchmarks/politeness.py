"""Politeness figures of issue 4, measured at the server (the fault site), with real workers.

    .venv/bin/python benchmarks/politeness.py \
        {quota,concurrency,retry-after,burst,breaker,overhead,all}

Each sub-command starts a throwaway Redis and the :class:`FaultSite`, enqueues tasks of one site
(``site_id`` ``faults_a``, URLs ``/a/p<i>``) with TaskWriter into a fresh namespace, runs
``scrapy crawl probe`` workers (``tests/e2e_project``, the add-on; CONCURRENT_REQUESTS 16 and 16
per slot) and reads what the site received. The figure is the last line; ``all`` runs every
bench and repeats the figures at the end. ``--keep`` keeps the worker logs.

* ``quota``: 4 workers, METEORSEED_SITE_RATE=20 (burst 5), tasks for ~30 s: the rate from the
  arrival after the first burst to the last arrival. Goal within ±5 % of 20.
* ``concurrency``: METEORSEED_SITE_CONCURRENCY=3, pages answering after 1 s, 4 workers (rate
  not binding): the most requests the server had in flight at once. Goal never > 3.
* ``retry-after``: 4 workers at 10 req/s; after 30 requests the site answers one 429 with
  ``Retry-After: 3``: arrivals 0.5-2.5 s after it was sent (goal 0) and when the next came.
* ``burst``: 1 worker, CONCURRENT_REQUESTS 16; its first 16 requests answer 429 with
  ``Retry-After: 3`` after 0.3 s, so all 16 are in flight when the first 429 arrives: requests
  0.5-2.5 s after the first 429 (goal 0), when the next came (goal 3 s + up to 10 % jitter),
  tasks stored (goal all) and strikes counted (goal 1: the burst is one strike, not 16).
* ``breaker``: 4 workers at 10 req/s (``--breaker-rate``; at the default 2 req/s even no breaker
  would stay within 40); after 20 requests the site answers 503 for 20 s, with
  METEORSEED_BREAKER_WINDOW=5 and METEORSEED_BREAKER_PROBE_INTERVAL=3: requests that reached it
  while down (goal ≤ 40), then items stored vs tasks (goal all) and the dead-letter stream's
  length (goal 0).
* ``overhead``: 1 worker, unthrottled (rate, burst, concurrency 1e6), the politeness downloader
  middlewares on vs off (``DOWNLOADER_MIDDLEWARES`` with None values), alternating order per
  round: server-side throughput from first to last arrival, median ratio. Goal ≤ 5 %.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from politeness_harness import SITE, SITE_ID, Bench, wait_until, window_rates

from meteorseed_scrapy.queue.keys import KeyLayout

#: The politeness downloader middlewares that ``overhead`` switches off (missing names are
#: fine: a None entry is never imported). Classes found in ``meteorseed_scrapy.middlewares``
#: at run time are added, so the list cannot fall behind the code.
POLITENESS_MIDDLEWARES = (
    "meteorseed_scrapy.middlewares.BackoffMiddleware",
    "meteorseed_scrapy.middlewares.CircuitBreakerMiddleware",
    "meteorseed_scrapy.middlewares.BlacklistMiddleware",  # item 5, names not settled yet
    "meteorseed_scrapy.middlewares.UserAgentPoolMiddleware",
    "meteorseed_scrapy.middlewares.ProxyPoolMiddleware",
)
KEEP_MIDDLEWARES = ("SiteSlotMiddleware",)  # not politeness: present before issue 4
UNTHROTTLED = {"METEORSEED_SITE_RATE": 1_000_000, "METEORSEED_SITE_BURST": 1_000_000,
               "METEORSEED_SITE_CONCURRENCY": 1_000_000}


def politeness_middlewares() -> list[str]:
    names = set(POLITENESS_MIDDLEWARES)
    try:
        import meteorseed_scrapy.middlewares as module
    except Exception as exc:  # mid-edit by someone else: fall back on the constant
        print(f"(cannot import meteorseed_scrapy.middlewares: {exc!r})", file=sys.stderr)
        return sorted(names)
    for name, obj in vars(module).items():
        hooks = ("process_request", "process_response", "process_exception")
        if (isinstance(obj, type) and name not in KEEP_MIDDLEWARES
                and obj.__module__.startswith("meteorseed_scrapy")
                and any(hasattr(obj, hook) for hook in hooks)):
            names.add(f"{module.__name__}.{name}")
            names.add(f"{obj.__module__}.{obj.__qualname__}")
    return sorted(names)


def _gap(t: float | None) -> str:
    return "none" if t is None else f"{t:.2f} s"


def quota(args: argparse.Namespace) -> str:
    rate, burst, n_workers = args.rate, args.burst, 4
    n = int(rate * args.seconds) + burst
    with Bench("quota", keep=args.keep) as bench:
        bench.enqueue(bench.urls(n))
        bench.workers(n_workers, METEORSEED_SITE_RATE=rate, METEORSEED_SITE_BURST=burst)
        bench.wait_workers(args.seconds * 4 + 120)
        times, stored = bench.site.arrivals(SITE), bench.stored()
    if len(times) < burst + 2:
        return f"server-side rate: not measured (only {len(times)} requests reached the site)"
    steady = times[burst:]
    measured = (len(steady) - 1) / (steady[-1] - steady[0])
    windows = ", ".join(f"{r:.1f}" for r in window_rates(steady, 5.0)[:-1])
    print(f"{len(times)} requests over {times[-1] - times[0]:.1f} s; first {burst} "
          f"(the burst) within {times[burst - 1] - times[0]:.2f} s; {stored} of {n} tasks "
          f"stored; req/s per 5 s window: {windows or '-'}")
    return (f"server-side rate: {measured:.2f} req/s for quota {rate:g} "
            f"({100 * measured / rate:.1f} % of quota, goal within ±5 %)")


def concurrency(args: argparse.Namespace) -> str:
    cap = args.cap
    with Bench("concurrency", keep=args.keep) as bench:
        bench.site.set_mode(SITE, "slow", delay=args.delay)
        bench.enqueue(bench.urls(args.tasks))
        bench.workers(4, METEORSEED_SITE_CONCURRENCY=cap, METEORSEED_SITE_RATE=1000,
                      METEORSEED_SITE_BURST=1000)
        bench.wait_workers(args.tasks * args.delay + 180)
        hits, stored = bench.site.hits(SITE), bench.stored()
    seen = Counter(h.in_flight for h in hits)
    print(f"{len(hits)} requests of {args.delay:g} s each; {stored} of {args.tasks} tasks "
          f"stored; in flight at arrival: {dict(sorted(seen.items()))}")
    most = max(seen, default=0)
    return f"max in flight seen by the server: {most} with cap {cap} (goal never > {cap})"


def retry_after(args: argparse.Namespace) -> str:
    rate, wait = 10, 3
    with Bench("retry-after", keep=args.keep) as bench:
        bench.enqueue(bench.urls(rate * 25))
        bench.workers(4, METEORSEED_SITE_RATE=rate, METEORSEED_SITE_BURST=5)
        site = bench.site
        if not wait_until(lambda: len(site.arrivals(SITE)) >= args.after, 120):
            return "retry-after: not measured (the workers sent no requests)"
        site.set_mode(SITE, 429, retry_after=wait, times=1)
        hit = wait_until(lambda: next((h for h in site.hits(SITE)
                                       if h.status == 429 and h.finish is not None), None), 60)
        bench.wait_workers(300)
        times, stored = site.arrivals(SITE), bench.stored()
    if hit is None or hit.finish is None:
        return "retry-after: not measured (no request got the 429: the run ended first)"
    sent = hit.finish
    after = [t - sent for t in times if t > sent]
    inside = [d for d in after if 0.5 <= d <= 2.5]
    later = next((d for d in after if d > 0.5), None)
    print(f"{len(times)} requests, {stored} of {rate * 25} tasks stored; the 429 went out "
          f"{sent - times[0]:.2f} s into the run; arrivals within 0.5 s after it (in flight "
          f"before it, excepted): {sum(d < 0.5 for d in after)}; first arrival after it: "
          f"{_gap(after[0] if after else None)}")
    if not times or times[-1] < sent + 2.5:
        print("warning: the run ended less than 2.5 s after the 429: a 0 would prove nothing")
    return (f"requests 0.5-2.5 s after the 429 (Retry-After: {wait}): {len(inside)} (goal 0); "
            f"next request {_gap(later)} after it")


def _strikes(bench: Bench) -> int:
    """The strikes pause.lua counted for the bench's site ('<strikes>:<ms>')."""
    client = redis.Redis.from_url(bench.redis_url, decode_responses=True)
    try:
        record = client.get(KeyLayout(bench.namespace).site(SITE_ID, "strikes"))
    finally:
        client.close()
    return int(str(record).split(":")[0]) if record else 0


def burst(args: argparse.Namespace) -> str:
    wait, n, in_flight = 3, 40, 16
    with Bench("burst", keep=args.keep) as bench:
        bench.site.set_mode(SITE, 429, retry_after=wait, delay=0.3, times=in_flight)
        bench.enqueue(bench.urls(n))
        bench.workers(1, CONCURRENT_REQUESTS=in_flight)
        finished = bench.wait_workers(120)
        hits, stored, strikes = bench.site.hits(SITE), bench.stored(), _strikes(bench)
    first = min((h.finish for h in hits if h.status == 429 and h.finish is not None),
                default=None)
    if first is None:
        return "burst: not measured (no request got a 429)"
    after = sorted(h.arrival - first for h in hits if h.arrival > first)
    inside = [d for d in after if 0.5 <= d <= 2.5]
    print(f"{len(hits)} requests; in flight when the first 429 arrived: "
          f"{sum(h.arrival < first for h in hits)}; worker "
          f"{'closed' if finished else 'killed at the timeout (2 min)'}")
    return (f"burst of {in_flight} 429s (Retry-After: {wait}): requests 0.5-2.5 s after the "
            f"first: {len(inside)} (goal 0); resumed {_gap(after[0] if after else None)} after "
            f"it (goal {wait} s + ≤ 10 %); stored {stored} of {n} (goal all); strikes {strikes} "
            "(goal 1)")


def breaker(args: argparse.Namespace) -> str:
    rate, down = args.breaker_rate, args.down
    n = args.tasks
    with Bench("breaker", keep=args.keep) as bench:
        bench.enqueue(bench.urls(n))
        # The package defaults for everything else (the probe project loosens them for tests).
        bench.workers(4, METEORSEED_SITE_RATE=rate, METEORSEED_SITE_BURST=5,
                      METEORSEED_SITE_CONCURRENCY=4, METEORSEED_BACKOFF_BASE=1,
                      METEORSEED_BREAKER_WINDOW=5, METEORSEED_BREAKER_PROBE_INTERVAL=3)
        site = bench.site
        if not wait_until(lambda: len(site.arrivals(SITE)) >= 20, 120):
            return "breaker: not measured (the workers sent no requests)"
        start = time.monotonic()
        site.set_mode(SITE, 503, duration=down)
        finished = bench.wait_workers(down + args.timeout)
        times, hits = site.arrivals(SITE), site.hits(SITE)
        stored, dead = bench.stored(), bench.dead()
    while_down = [t for t in times if start <= t < start + down]
    statuses = Counter(h.status for h in hits)
    after = [t for t in times if t >= start + down]
    print(f"{len(times)} requests; statuses {dict(statuses)}; while down: {len(while_down)} "
          f"(req/s per 5 s window: {', '.join(f'{r:.1f}' for r in window_rates(while_down, 5))}"
          f"); after: {len(after)}, the last {(times[-1] - start - down) if after else 0:.1f} s "
          f"after recovery; workers {'closed' if finished else 'killed at the timeout'}")
    return (f"requests while down {down:g} s at {rate:g} req/s: {len(while_down)} (goal ≤ 40); "
            f"stored {stored} "
            f"of {n} tasks (goal all); dead-lettered {dead} (goal 0)")


def _overhead_run(args: argparse.Namespace, polite: bool,
                  disable: list[str]) -> tuple[float, float]:
    """(server-side req/s, worker CPU ms per page) of one run."""
    settings: dict[str, Any] = dict(UNTHROTTLED)
    if not polite:
        settings["DOWNLOADER_MIDDLEWARES"] = dict.fromkeys(disable)
        # ...and the scheduler's quota gate (per-site permits leased from Redis) off too.
        settings["METEORSEED_POLITENESS"] = False
    with Bench(f"overhead-{'on' if polite else 'off'}", keep=args.keep) as bench:
        bench.enqueue(bench.urls(args.pages))
        (worker,) = bench.workers(1, **settings)
        bench.wait_workers(300)
        times, stored = bench.site.arrivals(SITE), bench.stored()
        enabled = [m for m in worker.enabled_downloader_middlewares() if m in disable]
        cpu_ms = 1000 * bench.worker_cpu / max(1, len(times))
    if stored != args.pages:
        print(f"  warning: {stored} of {args.pages} tasks stored")
    throughput = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    print(f"  politeness {'on ' if polite else 'off'}: {throughput:7.1f} req/s, worker CPU "
          f"{cpu_ms:.2f} ms/page (start-up included); politeness middlewares enabled: "
          f"{', '.join(m.rsplit('.', 1)[1] for m in enabled) or 'none'}")
    if not polite and enabled:
        print("  warning: the 'off' run still had politeness middlewares enabled")
    return throughput, cpu_ms


def overhead(args: argparse.Namespace) -> str:
    disable = politeness_middlewares()
    ratios, cpu_ratios, on_runs, off_runs = [], [], [], []
    for r in range(args.rounds):
        result: dict[bool, tuple[float, float]] = {}
        for polite in ((True, False) if r % 2 == 0 else (False, True)):
            result[polite] = _overhead_run(args, polite, disable)
        (on, on_cpu), (off, off_cpu) = result[True], result[False]
        on_runs.append(on)
        off_runs.append(off)
        if off > 0 and off_cpu > 0:
            ratios.append(on / off)
            cpu_ratios.append(on_cpu / off_cpu)
    if not ratios:
        return "overhead: not measured"
    cost = 100 * (1 - statistics.median(ratios))
    print(f"worker CPU per page, on vs off: {100 * (statistics.median(cpu_ratios) - 1):+.1f} % "
          "(median ratio; start-up included)")
    return (f"overhead of politeness (quota gate + middlewares): {cost:.1f} % of throughput "
            f"(median of {len(ratios)} rounds; {statistics.median(on_runs):.0f} vs "
            f"{statistics.median(off_runs):.0f} req/s; goal ≤ 5 %)")


BENCHES: dict[str, Callable[[argparse.Namespace], str]] = {
    "quota": quota, "concurrency": concurrency, "retry-after": retry_after, "burst": burst,
    "breaker": breaker, "overhead": overhead,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", choices=[*BENCHES, "all"])
    parser.add_argument("--keep", action="store_true", help="keep the worker logs")
    parser.add_argument("--rate", type=float, default=20.0, help="quota: req/s (20)")
    parser.add_argument("--burst", type=int, default=5, help="quota: burst (5)")
    parser.add_argument("--seconds", type=float, default=30.0, help="quota: run length (30)")
    parser.add_argument("--cap", type=int, default=3, help="concurrency: the cap (3)")
    parser.add_argument("--delay", type=float, default=1.0, help="concurrency: page delay (1)")
    parser.add_argument("--tasks", type=int, default=0,
                        help="concurrency (45) / breaker (200): tasks")
    parser.add_argument("--after", type=int, default=30, help="retry-after: 429 after N (30)")
    parser.add_argument("--down", type=float, default=20.0, help="breaker: seconds down (20)")
    parser.add_argument("--breaker-rate", type=float, default=10.0,
                        help="breaker: METEORSEED_SITE_RATE (10)")
    parser.add_argument("--timeout", type=float, default=240.0,
                        help="breaker: seconds to wait after the site is back (240)")
    parser.add_argument("--rounds", type=int, default=5, help="overhead: rounds (5)")
    parser.add_argument("--pages", type=int, default=1500, help="overhead: pages per run")
    args = parser.parse_args(argv)
    figures, tasks = [], args.tasks
    for name in BENCHES if args.bench == "all" else [args.bench]:
        args.tasks = tasks or {"concurrency": 45, "breaker": 200}.get(name, 0)
        print(f"== {name}", flush=True)
        figures.append(BENCHES[name](args))
        print(figures[-1], flush=True)
    if len(figures) > 1:
        print("== figures")
        print("\n".join(figures))


if __name__ == "__main__":
    main()

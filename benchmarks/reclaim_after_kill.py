"""How long a SIGKILLed worker's tasks stay stranded, and whether anything is lost.

    .venv/bin/python benchmarks/reclaim_after_kill.py [--rounds 3] [--pages 300]
        [--delay-ms 200] [--claim-idle 10]

Two MeteorSeed workers (``bench_project``, the add-on's set-up, one SQLite store) share one
namespace of slow pages (``--delay-ms`` each, from ``bench_site.py`` in its own process). Once
``--kill-at`` of the tasks are acked and worker ``w1`` holds pending tasks, ``w1`` gets SIGKILL.
The figure is the time from the kill until every task that was pending on ``w1`` is pending on
the living worker or acked (XPENDING summary polled every 50 ms). At the end of each round: every
task's item is stored exactly once (one row per task, the right keys and task ids), nothing is
pending, waiting or dead. METEORSEED_CLAIM_IDLE is the setting's default (10 s) unless
``--claim-idle`` says otherwise (``--claim-idle 5`` for a quick run). The target is that the
tasks are in progress elsewhere well within 10 s with the defaults: the survivor does not wait
until they are idle for CLAIM_IDLE (a task delivered just before the kill would need all of it)
but takes them once the dead worker's liveness lapses in the live-worker registry, CLAIM_IDLE/2
after its last heartbeat (``queue/fleet/liveness.py``), about 5 s. The site's fleet-wide
concurrency cap is both workers' CONCURRENT_REQUESTS (``--site-concurrency`` to change it), so
that what is measured is the reclaim, not the expiry of the dead worker's concurrency leases.
The last line is the figure.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _crawl_rig import (
    BenchSite,
    Worker,
    bench_rig,
    enqueue_tasks,
    log_errors,
    median,
    source_label,
    start_worker,
    wait_until,
)

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.testing.redis_server import RedisServer

POLL = 0.05


@dataclass
class Result:
    round: int
    held: int  # tasks pending on the victim when it was killed
    done_at_kill: int
    idle_at_kill_ms: tuple[int, int]  # min/max idle time of the victim's entries at the kill
    reclaim_s: float
    #: until every one of them was done (acked, so deleted from the stream) on the survivor: a
    #: site at its concurrency cap makes them wait for the dead worker's leases to expire too
    done_s: float
    stored: int
    lost: int
    problems: list[str]
    refetched: int
    survivor_stats: dict[str, Any]


def pending_of(client: redis.Redis, keys: KeyLayout) -> dict[str, int]:
    summary: Any = client.xpending(keys.stream, keys.group)
    return {c["name"]: int(c["pending"]) for c in summary.get("consumers") or []}


def run_round(rnd: int, args: argparse.Namespace, server: RedisServer, site: BenchSite,
              workdir: Path) -> Result:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    client.flushall()
    namespace = f"reclaim{rnd}"
    keys = KeyLayout(namespace)
    rundir = workdir / f"r{rnd}"
    rundir.mkdir()
    store = rundir / "items.db"
    hits_before = site.hits()["paths"]
    paths = [f"/item/{rnd * 100_000 + i}" for i in range(args.pages)]
    urls = [f"{site.url}{p}?delay={args.delay_ms}" for p in paths]
    if enqueue_tasks(server.url, namespace, urls) != args.pages:
        raise RuntimeError("not every task was enqueued")
    settings = {
        "METEORSEED_REDIS_URL": server.url,
        "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_STORE_URI": f"sqlite:///{store}",
        "METEORSEED_IDLE_CLOSE": 2,
        "CONCURRENT_REQUESTS": args.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": args.concurrency,
        "METEORSEED_SITE_CONCURRENCY": args.site_concurrency or 2 * args.concurrency,
    }
    if args.claim_idle is not None:
        settings["METEORSEED_CLAIM_IDLE"] = args.claim_idle
    workers: dict[str, Worker] = {
        name: start_worker(rundir, name, "bench", "bench.settings_meteorseed",
                           {**settings, "METEORSEED_CONSUMER": name})
        for name in ("w1", "w2")
    }
    victim, survivor = workers["w1"], workers["w2"]
    try:
        def ready_to_kill() -> bool:
            if victim.proc.poll() is not None:
                raise RuntimeError("w1 finished before it could be killed: raise --pages")
            try:
                held = pending_of(client, keys).get("w1", 0)
            except redis.ResponseError:  # no group yet
                return False
            done = args.pages - int(client.xlen(keys.stream))
            return held > 0 and done >= args.kill_at * args.pages

        wait_until(ready_to_kill, timeout=120, interval=POLL)
        victim.proc.kill()
        killed_at = time.monotonic()
        victim.proc.wait()
        done_at_kill = args.pages - int(client.xlen(keys.stream))
        entries: Any = client.xpending_range(keys.stream, keys.group, "-", "+", 100_000, "w1")
        held_ids = {e["message_id"] for e in entries}
        idle = [int(e["time_since_delivered"]) for e in entries] or [0]
        print(f"round {rnd}: SIGKILL w1 holding {len(held_ids)} pending tasks, "
              f"{done_at_kill}/{args.pages} done; their idle time at the kill "
              f"{min(idle)}-{max(idle)} ms", flush=True)

        limit = (args.claim_idle or DEFAULTS["METEORSEED_CLAIM_IDLE"]) * 3 + 60
        while pending_of(client, keys).get("w1", 0) > 0:
            if time.monotonic() - killed_at > limit:
                raise RuntimeError(f"w1's tasks still pending {limit:.0f}s after the kill")
            if survivor.proc.poll() is not None:
                raise RuntimeError("w2 exited while w1's tasks were pending")
            time.sleep(POLL)
        reclaim_s = time.monotonic() - killed_at
        while any(client.xrange(keys.stream, m, m) for m in held_ids):
            if time.monotonic() - killed_at > 2 * limit:
                raise RuntimeError(f"w1's tasks not done {2 * limit:.0f}s after the kill")
            time.sleep(POLL)
        done_s = time.monotonic() - killed_at
        still: Any = client.xpending_range(keys.stream, keys.group, "-", "+", 100_000)
        owners = {e["message_id"]: e["consumer"] for e in still}
        problems = [f"{m} still on {owners[m]}" for m in held_ids if owners.get(m, "w2") != "w2"]

        code = survivor.wait(timeout=limit + 120)
        if code != 0 or log_errors(survivor):
            problems.append(f"w2 exit code {code}, errors {log_errors(survivor)[:3]}")
        survivor_stats = survivor.timing()["stats"]
    finally:
        for w in workers.values():
            w.kill()

    # Every task's item stored exactly once, nothing pending, waiting or dead.
    with sqlite3.connect(store) as conn:
        rows = conn.execute(
            "SELECT _id, json_extract(doc, '$.unique_key'), json_extract(doc, '$.url') FROM items"
        ).fetchall()
    expected = {f"article-{p.rsplit('/', 1)[1]}" for p in paths}
    got = [key for _, key, _ in rows]
    if len(got) != len(set(got)):
        problems.append(f"{len(got) - len(set(got))} items stored more than once")
    missing = expected - set(got)
    extra = set(got) - expected
    if extra:
        problems.append(f"{len(extra)} unexpected items")
    summary: Any = client.xpending(keys.stream, keys.group)
    left = {"pending": int(summary["pending"]), "stream": int(client.xlen(keys.stream)),
            "dead": int(client.xlen(keys.dead))}
    problems += [f"{n} {what}" for what, n in left.items() if n]
    client.close()
    hits = site.hits()["paths"]
    refetched = sum(1 for p in paths if hits.get(p, 0) - hits_before.get(p, 0) > 1)
    return Result(rnd, len(held_ids), done_at_kill, (min(idle), max(idle)), reclaim_s, done_s,
                  len(set(got) & expected), len(missing), problems, refetched, survivor_stats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--delay-ms", type=int, default=200, help="page latency of the site")
    parser.add_argument("--claim-idle", type=float, default=None,
                        help="METEORSEED_CLAIM_IDLE for the workers (default: the setting's "
                             f"default, {DEFAULTS['METEORSEED_CLAIM_IDLE']})")
    parser.add_argument("--concurrency", type=int, default=16, help="CONCURRENT_REQUESTS")
    parser.add_argument("--site-concurrency", type=int, default=None,
                        help="METEORSEED_SITE_CONCURRENCY, fleet-wide (default: both workers' "
                             "CONCURRENT_REQUESTS; at one worker's, the dead worker's "
                             "concurrency leases hold the survivor back until they expire)")
    parser.add_argument("--kill-at", type=float, default=0.3,
                        help="share of the tasks acked before w1 is killed")
    parser.add_argument("--keep", metavar="DIR", help="keep logs and SQLite files here")
    args = parser.parse_args(argv)
    claim_idle = float(args.claim_idle if args.claim_idle is not None
                       else DEFAULTS["METEORSEED_CLAIM_IDLE"])
    target = 10.0

    results: list[Result] = []
    with bench_rig(args.keep, "meteorseed-reclaim-") as (workdir, server, site):
        print(source_label(), flush=True)
        print(f"{args.pages} pages of {args.delay_ms} ms, 2 workers x "
              f"CONCURRENT_REQUESTS={args.concurrency}, CLAIM_IDLE={claim_idle:g}, "
              f"{args.rounds} rounds; work dir {workdir}", flush=True)
        for rnd in range(1, args.rounds + 1):
            r = run_round(rnd, args, server, site, workdir)
            results.append(r)
            s = r.survivor_stats
            print(f"round {rnd}: reclaimed {r.held} tasks {r.reclaim_s:.1f}s after SIGKILL, "
                  f"all done {r.done_s:.1f}s after it; "
                  f"stored {r.stored}/{args.pages}, lost {r.lost}; refetched pages "
                  f"{r.refetched}; w2 reclaimed {s.get('meteorseed/reclaimed', 0)} ("
                  f"{s.get('meteorseed/reclaimed/dead_worker', 0)} as a dead worker's), acked "
                  f"without refetch {s.get('meteorseed/acked_without_refetch', 0)}; "
                  + ("problems: " + "; ".join(r.problems) if r.problems else "all checks ok"),
                  flush=True)

    times = [r.reclaim_s for r in results]
    lost = sum(r.lost for r in results)
    problems = sum(len(r.problems) for r in results)
    print()
    done = [r.done_s for r in results]
    print(f"done on the survivor: {', '.join(f'{t:.1f}' for t in done)} s after SIGKILL "
          f"(median {median(done):.1f})")
    print(f"reclaim times: {', '.join(f'{t:.1f}' for t in times)} s (max {max(times):.1f}); "
          f"tasks held by the killed worker: {', '.join(str(r.held) for r in results)}")
    print(f"reclaimed {round(median([r.held for r in results]))} tasks "
          f"{median(times):.1f}s after SIGKILL (median of {len(results)} rounds, max "
          f"{max(times):.1f}s; CLAIM_IDLE={claim_idle:g}, target <= {target:g}s); lost {lost}"
          + (f"; {problems} check(s) FAILED" if problems else "; stored exactly once, "
             "nothing pending or dead"))


if __name__ == "__main__":
    main()

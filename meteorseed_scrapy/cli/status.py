"""``meteorseed status``: the queue (backlog and pending per lane and band, delayed tasks by
site and reason, dead letters, consumers, throughput totals), dedup sets, Redis.

The queue is read by :func:`meteorseed_scrapy.queue.inspect.status.read_status`, the one reader the
API,
the console, the metrics and the workers' idle check share; its counts agree at one instant per
shard (one MULTI each).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from meteorseed_scrapy.cli.common import Context, add_target_options, table
from meteorseed_scrapy.queue.inspect.status import read_status
from meteorseed_scrapy.queue.scan import glob_escape, scan_namespace
from meteorseed_scrapy.task.lanes import BANDS

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis

#: At most this many ``<ns>:seen:*`` sets are sized: status must stay cheap on a big Redis.
MAX_SEEN_KEYS = 200
#: Delayed-set entries read for the breakdown by site and reason (the soonest due); the total
#: and the next due time are exact whatever the size.
DELAYED_SCAN_CLI = 10_000
#: Rows of the delayed-by-site table (``--json`` lists every site).
MAX_ROWS = 20


def register(sub: Any) -> None:
    parser = sub.add_parser("status", help="backlog and pending per lane, delayed tasks, "
                            "consumers, dead letters, Redis")
    add_target_options(parser)
    parser.set_defaults(run=run)


def _seen_sizes(client: SyncRedis, ctx: Context) -> tuple[dict[str, int], bool]:
    """URLs recorded per site: a dedup root ``<ns>:seen:{site}`` is a hash whose live
    generations ``<root>:<w>:<g>`` count their entries in ``n`` (``lua/dedup_lib.lua``); an
    older namespace may still hold a plain set there."""
    roots: list[str] = []
    truncated = False
    for key, _ in _seen_roots(client, ctx):
        if len(roots) == MAX_SEEN_KEYS:
            truncated = True
            break
        roots.append(key)
    pipe = client.pipeline(transaction=False)
    for key in roots:
        pipe.type(key)
        pipe.hget(key, "w")  # (an error for a set root: ignored below)
    replies = pipe.execute(raise_on_error=False) if roots else []
    now = int(time.time())
    pipe = client.pipeline(transaction=False)
    shapes: list[tuple[str, int]] = []  # (kind, how many replies it takes)
    for key, kind, window in zip(roots, replies[::2], replies[1::2], strict=True):
        if kind == "set":
            pipe.scard(key)
            shapes.append(("set", 1))
        elif kind == "hash":
            w = int(window or 0) if not isinstance(window, Exception) else 0
            gens = [now // w, now // w - 1] if w > 0 else [0]
            for g in gens:
                pipe.hget(f"{key}:{w}:{g}", "n")
            shapes.append(("hash", len(gens)))
        else:
            shapes.append(("none", 0))
    sizes = iter(pipe.execute() if len(pipe) else [])
    sites = dict(_seen_roots(client, ctx, roots))
    out = {}
    for key, (_, n) in zip(roots, shapes, strict=True):
        out[sites[key]] = sum(int(next(sizes) or 0) for _ in range(n))
    return dict(sorted(out.items())), truncated


def _seen_roots(client: SyncRedis, ctx: Context, known: list[str] | None = None
                ) -> Iterator[tuple[str, str]]:
    """``(dedup root, site)``: ``<ns>:seen:{site}``, or ``<ns>:{s<k>}:seen:<site>`` of a
    tagged layout (roots only: a site's generations and buckets are many more keys, and a
    site id with a colon is not told apart from them there). ``known``: name these roots."""
    if ctx.keys.tagged:
        for shard in ctx.keys.shard_keys:
            prefix = f"{shard.prefix}:seen:"
            for key in known if known is not None else scan_namespace(
                    client, ctx.keys, f"{glob_escape(prefix[len(ctx.keys.namespace) + 1:])}*"):
                if key.startswith(prefix) and ":" not in key[len(prefix):]:
                    yield key, key[len(prefix):]
        return
    prefix = f"{ctx.keys.namespace}:seen:"
    for key in known if known is not None else scan_namespace(client, ctx.keys, "seen:{*}"):
        yield key, key[len(prefix) + 1:-1]


def _server(client: SyncRedis) -> dict[str, Any]:
    info = client.info("server")
    out: dict[str, Any] = {"version": info.get("redis_version"), "warnings": []}
    try:
        config = client.config_get("appendonly")
        config.update(client.config_get("maxmemory-policy"))
        config.update(client.config_get("save"))
    except ResponseError as exc:  # CONFIG is disabled on many managed services
        out["warnings"].append(f"cannot read persistence settings ({exc})")
        out["warning"] = True
        return out
    out["appendonly"] = config.get("appendonly")
    out["maxmemory_policy"] = config.get("maxmemory-policy")
    out["save"] = config.get("save")
    if out["maxmemory_policy"] != "noeviction":
        out["warnings"].append(
            f"maxmemory-policy is {out['maxmemory_policy']!r}: Redis may evict task streams "
            "under memory pressure; set it to 'noeviction'"
        )
    if out["appendonly"] != "yes":
        out["warnings"].append(
            "appendonly is off: a Redis restart loses tasks written since the last RDB "
            "snapshot (or all of them without save points)"
        )
    out["warning"] = bool(out["warnings"])
    return out


def collect(client: SyncRedis, ctx: Context) -> dict[str, Any]:
    """``status --json``: the queue snapshot (:mod:`meteorseed_scrapy.queue.inspect.status`, as the
    API and console read it), the dedup sets and the Redis server's settings."""
    status = read_status(client, ctx.keys, DELAYED_SCAN_CLI).to_json()
    seen, seen_truncated = _seen_sizes(client, ctx)
    return {**status, "seen": seen, "seen_truncated": seen_truncated,
            "redis": _server(client)}


def _due(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return f"overdue {-seconds:.1f}s" if seconds < 0 else f"in {seconds:.1f}s"


def _figure(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:g}{unit}"


def _say_delayed(ctx: Context, delayed: dict[str, Any]) -> None:
    reasons = ", ".join(f"{why} {n}" for why, n in delayed["reasons"].items())
    sampled = "" if delayed["scanned"] >= delayed["total"] else (
        f" (of the {delayed['scanned']} due soonest)")
    ctx.say(f"delayed    {delayed['total']:>10}   deferred, due later: next "
            f"{_due(delayed['next_due_in_s'])}; {reasons}{sampled}")


def _say_spiders(ctx: Context, spiders: list[dict[str, Any]]) -> None:
    rows = [{"spider": sp["spider"] or "(any: names no spider)", "backlog": sp["backlog"],
             "pending": sp["pending"], "delayed": sp["delayed"], "workers": sp["workers"],
             "note": "waiting: no live worker runs this spider" if sp["unserved"] else ""}
            for sp in spiders]
    ctx.say("\n".join(table(rows, ("spider", "backlog", "pending", "delayed", "workers",
                                   "note"))))


def run(args: argparse.Namespace, ctx: Context) -> int:
    status = collect(ctx.client, ctx)
    if ctx.json:
        ctx.emit_json(status)
        return 0
    server = status["redis"]
    delayed = status["delayed"]
    ctx.say(f"namespace  {status['namespace']}   (redis {server.get('version')} at {ctx.url})")
    ctx.say(f"backlog    {status['backlog']:>10}   tasks waiting to be delivered")
    ctx.say(f"pending    {status['pending']:>10}   delivered, not acked yet")
    if delayed["total"]:
        _say_delayed(ctx, delayed)
    else:
        ctx.say(f"delayed    {0:>10}   deferred, due later")
    ctx.say(f"dead       {status['dead']:>10}   dead letters ({', '.join(ctx.keys.deads[:3])}"
            f"{', ...' if len(ctx.keys.deads) > 3 else ''})")
    throughput = status["throughput"]
    if throughput["added_total"] is not None:
        ctx.say(f"added      {throughput['added_total']:>10}   tasks added to the streams, "
                f"{throughput['finished_total']} finished (since counting began)")
    if len(status["shards"]) > 1:
        ctx.say(f"shards     {len(status['shards']):>10}   METEORSEED_STREAM_SHARDS")
    ctx.say()
    rows = [{"lane": lane, "backlog": v["backlog"], "pending": v["pending"],
             **{f"backlog_{b}": v["bands"][b]["backlog"] for b in BANDS}}
            for lane, v in status["lanes"].items()]
    ctx.say("\n".join(table(rows, ("lane", "backlog", "pending",
                                   *(f"backlog_{b}" for b in BANDS)))))
    if len(status["spiders"]) > 1:  # (named task sets: the backlog per spider)
        ctx.say()
        _say_spiders(ctx, status["spiders"])
    if delayed["sites"]:
        ctx.say()
        # (table() escapes each cell: a site id from Redis may hold an escape sequence)
        rows = [{"site": s["site_id"] or "(damaged entry)", "delayed": s["count"],
                 "why": ", ".join(f"{why} {n}" for why, n in s["reasons"].items()),
                 "next_due": _due(s["next_due_in_s"])} for s in delayed["sites"][:MAX_ROWS]]
        ctx.say("\n".join(table(rows, ("site", "delayed", "why", "next_due"))))
        if len(delayed["sites"]) > MAX_ROWS:
            ctx.say(f"(first {MAX_ROWS} sites only: --json lists them all)")
    if status["throttles"]:
        ctx.say()
        # Fleet-wide adaptive limits and robots.txt caps (docs/politeness.md).
        rows = [{"site": t["site_id"], "target_rate": _figure(t["target_rate"], "/s"),
                 "latency": _figure(t["latency_ms"], " ms"), "in_flight": t["in_flight"],
                 "robots_delay": _figure(t["robots_interval_s"], " s")}
                for t in status["throttles"][:MAX_ROWS]]
        ctx.say("\n".join(table(rows, ("site", "target_rate", "latency", "in_flight",
                                       "robots_delay"))))
    ctx.say()
    if status["consumers"]:
        ctx.say("\n".join(table(status["consumers"], ("name", "pending", "idle_ms"))))
    elif throughput["finished_total"] or status["dead"]:
        ctx.say("no consumers now (the workers that read the streams have left)")
    else:
        ctx.say("no consumers (no worker has read the streams yet)")
    if status["live_workers"] is not None:
        ctx.say(f"live workers {status['live_workers']} (liveness registry)")
    if status["seen"]:
        ctx.say()
        rows = [{"site": s, "seen_urls": n} for s, n in status["seen"].items()]
        ctx.say("\n".join(table(rows, ("site", "seen_urls"))))
        if status["seen_truncated"]:
            ctx.say(f"(first {MAX_SEEN_KEYS} sites only)")
    ctx.say()
    ctx.say(f"persistence: appendonly={server.get('appendonly', '?')} "
            f"maxmemory-policy={server.get('maxmemory_policy', '?')}")
    memory = status["redis_memory"]
    if memory is not None:
        ctx.say(f"memory: {_mib(memory['used_bytes'])} used of "
                f"{_mib(memory['max_bytes']) if memory['max_bytes'] else 'no maxmemory'}"
                + (f" ({memory['used_fraction']:.0%})" if memory["max_bytes"] else ""))
        if memory["near_limit"]:
            ctx.say(f"WARNING: Redis memory is at {memory['used_fraction']:.0%} of maxmemory: "
                    "with 'noeviction' new tasks, acks and retries will be refused when it is "
                    "full (raise maxmemory, or trim dead letters and seen sets)")
    for warning in server["warnings"]:
        ctx.say(f"WARNING: {warning}")
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"

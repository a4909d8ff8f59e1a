"""``meteorseed status``: backlog and pending per lane, pending work per consumer, dead letters,
dedup sets, Redis.

The counts that must agree (each task stream's length and pending, dead) are read in one MULTI
per shard, so ``backlog = stream_length - pending`` is exact at one instant for each shard, as
in ``TaskWriter.backlog`` (workers XDEL an entry right after XACKing it, so XLEN counts
waiting + pending entries).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

import redis
from redis.exceptions import ResponseError

from meteorseed_scrapy.cli.common import (
    Context,
    add_target_options,
    glob_escape,
    scan_namespace,
    table,
)
from meteorseed_scrapy.queue.writer import StreamCount
from meteorseed_scrapy.task.lanes import BANDS, LANES

#: At most this many ``<ns>:seen:*`` sets are sized: status must stay cheap on a big Redis.
MAX_SEEN_KEYS = 200


def register(sub: Any) -> None:
    parser = sub.add_parser("status", help="backlog and pending per lane, consumers, dead "
                            "letters, Redis")
    add_target_options(parser)
    parser.set_defaults(run=run)


def _consumers(client: redis.Redis, ctx: Context) -> list[dict[str, Any]]:
    """Consumers of the group over every task stream: pending summed, the least idle time."""
    pipe = client.pipeline(transaction=False)
    for stream in ctx.keys.streams:
        pipe.xinfo_consumers(stream, ctx.keys.group)
    found: dict[str, dict[str, Any]] = {}
    for reply in pipe.execute(raise_on_error=False):
        if isinstance(reply, ResponseError):  # no stream or no group yet
            if "NOGROUP" in str(reply) or "no such key" in str(reply):
                continue
            raise reply
        # Redis 6.2 and 7.0 both report name, pending and idle (7.2 adds inactive).
        for c in reply:
            row = found.setdefault(c["name"], {"name": c["name"], "pending": 0,
                                               "idle_ms": int(c["idle"])})
            row["pending"] += int(c["pending"])
            row["idle_ms"] = min(row["idle_ms"], int(c["idle"]))
    return list(found.values())


def _seen_sizes(client: redis.Redis, ctx: Context) -> tuple[dict[str, int], bool]:
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


def _seen_roots(client: redis.Redis, ctx: Context, known: list[str] | None = None
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


def _server(client: redis.Redis) -> dict[str, Any]:
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


def collect(client: redis.Redis, ctx: Context) -> dict[str, Any]:
    lanes: dict[str, dict[str, Any]] = {
        lane: {"backlog": 0, "pending": 0,
               "bands": {b: {"backlog": 0, "pending": 0} for b in BANDS}} for lane in LANES
    }
    total, dead, shards = StreamCount(), 0, []
    counted: set[str] = set()  # (one Redis: every shard's dead letters are <ns>:dead)
    for shard in ctx.keys.shard_keys:  # one MULTI per shard: one slot on a cluster
        pipe = client.pipeline(transaction=True)
        for stream in shard.streams:
            pipe.xlen(stream)
            pipe.xpending(stream, ctx.keys.group)
        own_dead = shard.dead not in counted
        if own_dead:
            counted.add(shard.dead)
            pipe.xlen(shard.dead)
        *counts, shard_dead = pipe.execute(raise_on_error=False) + ([] if own_dead else [0])
        if isinstance(shard_dead, Exception):
            raise shard_dead
        dead += int(shard_dead)
        shard_total = StreamCount()
        for stream, length, pending in zip(shard.streams, counts[::2], counts[1::2],
                                           strict=True):
            count = StreamCount.of(length, pending)
            shard_total += count
            lane, band = shard.stream_lanes[stream]
            lanes[lane]["backlog"] += count.waiting
            lanes[lane]["pending"] += count.pending
            lanes[lane]["bands"][band]["backlog"] += count.waiting
            lanes[lane]["bands"][band]["pending"] += count.pending
        total += shard_total
        shards.append({"shard": shard.index, "stream": shard.stream, "backlog":
                       shard_total.waiting, "pending": shard_total.pending,
                       "dead": int(shard_dead) if len(ctx.keys.deads) > 1 else None})
    seen, seen_truncated = _seen_sizes(client, ctx)
    return {
        "namespace": ctx.keys.namespace,
        "stream": ctx.keys.shard_keys[0].stream,
        "backlog": total.waiting,  # tasks waiting in every stream
        "pending": total.pending,
        "stream_length": total.waiting + total.pending,
        "lanes": lanes,
        "shards": shards,
        "dead": dead,
        "consumers": _consumers(client, ctx),
        "seen": seen,
        "seen_truncated": seen_truncated,
        "redis": _server(client),
    }


def run(args: argparse.Namespace, ctx: Context) -> int:
    status = collect(ctx.client, ctx)
    if ctx.json:
        ctx.emit_json(status)
        return 0
    server = status["redis"]
    ctx.say(f"namespace  {status['namespace']}   (redis {server.get('version')} at {ctx.url})")
    ctx.say(f"backlog    {status['backlog']:>10}   tasks waiting to be delivered")
    ctx.say(f"pending    {status['pending']:>10}   delivered, not acked yet")
    ctx.say(f"dead       {status['dead']:>10}   dead letters ({', '.join(ctx.keys.deads[:3])}"
            f"{', ...' if len(ctx.keys.deads) > 3 else ''})")
    if len(status["shards"]) > 1:
        ctx.say(f"shards     {len(status['shards']):>10}   METEORSEED_STREAM_SHARDS")
    ctx.say()
    rows = [{"lane": lane, "backlog": v["backlog"], "pending": v["pending"],
             **{f"backlog_{b}": v["bands"][b]["backlog"] for b in BANDS}}
            for lane, v in status["lanes"].items()]
    ctx.say("\n".join(table(rows, ("lane", "backlog", "pending",
                                   *(f"backlog_{b}" for b in BANDS)))))
    ctx.say()
    if status["consumers"]:
        ctx.say("\n".join(table(status["consumers"], ("name", "pending", "idle_ms"))))
    else:
        ctx.say("no consumers (no worker has read the streams yet)")
    if status["seen"]:
        ctx.say()
        rows = [{"site": s, "seen_urls": n} for s, n in status["seen"].items()]
        ctx.say("\n".join(table(rows, ("site", "seen_urls"))))
        if status["seen_truncated"]:
            ctx.say(f"(first {MAX_SEEN_KEYS} sites only)")
    ctx.say()
    ctx.say(f"persistence: appendonly={server.get('appendonly', '?')} "
            f"maxmemory-policy={server.get('maxmemory_policy', '?')}")
    for warning in server["warnings"]:
        ctx.say(f"WARNING: {warning}")
    return 0

"""``meteorseed status``: backlog, pending work per consumer, dead letters, dedup sets, Redis.

The three counts that must agree (stream length, pending, dead) are read in one MULTI, so
``backlog = stream_length - pending`` is exact at one instant, as in ``TaskWriter.backlog``
(workers XDEL an entry right after XACKing it, so XLEN counts waiting + pending entries).
"""

from __future__ import annotations

import argparse
from typing import Any

import redis
from redis.exceptions import ResponseError

from meteorseed_scrapy.cli.common import Context, add_target_options, scan_namespace, table

#: At most this many ``<ns>:seen:*`` sets are sized: status must stay cheap on a big Redis.
MAX_SEEN_KEYS = 200


def register(sub: Any) -> None:
    parser = sub.add_parser("status", help="backlog, pending, consumers, dead letters, Redis")
    add_target_options(parser)
    parser.set_defaults(run=run)


def _pending(reply: Any) -> int:
    if isinstance(reply, ResponseError) and str(reply).startswith("NOGROUP"):
        return 0  # no worker ever started: every entry is waiting
    if isinstance(reply, Exception):
        raise reply
    return int(reply["pending"])


def _consumers(client: redis.Redis, ctx: Context) -> list[dict[str, Any]]:
    try:
        infos = client.xinfo_consumers(ctx.keys.stream, ctx.keys.group)
    except ResponseError as exc:  # no stream or no group yet
        if "NOGROUP" in str(exc) or "no such key" in str(exc):
            return []
        raise
    # Redis 6.2 and 7.0 both report name, pending and idle (7.2 adds inactive).
    return [{"name": c["name"], "pending": int(c["pending"]), "idle_ms": int(c["idle"])}
            for c in infos]


def _seen_sizes(client: redis.Redis, ctx: Context) -> tuple[dict[str, int], bool]:
    keys: list[str] = []
    truncated = False
    for key in scan_namespace(client, ctx.keys, "seen:*"):
        if len(keys) == MAX_SEEN_KEYS:
            truncated = True
            break
        keys.append(key)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.scard(key)
    sizes = pipe.execute() if keys else []
    prefix = f"{ctx.keys.namespace}:seen:"
    out = {}
    for key, size in zip(keys, sizes, strict=True):
        site = key[len(prefix):]
        if site.startswith("{") and site.endswith("}"):
            site = site[1:-1]
        out[site] = int(size)
    return dict(sorted(out.items())), truncated


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
    pipe = client.pipeline(transaction=True)
    pipe.xlen(ctx.keys.stream)
    pipe.xpending(ctx.keys.stream, ctx.keys.group)
    pipe.xlen(ctx.keys.dead)
    length, pending_reply, dead = pipe.execute(raise_on_error=False)
    for reply in (length, dead):
        if isinstance(reply, Exception):
            raise reply
    pending = _pending(pending_reply)
    seen, seen_truncated = _seen_sizes(client, ctx)
    return {
        "namespace": ctx.keys.namespace,
        "stream": ctx.keys.stream,
        "backlog": max(0, int(length) - pending),
        "pending": pending,
        "stream_length": int(length),
        "dead": int(dead),
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
    ctx.say(f"dead       {status['dead']:>10}   dead letters ({ctx.keys.dead})")
    ctx.say()
    if status["consumers"]:
        ctx.say("\n".join(table(status["consumers"], ("name", "pending", "idle_ms"))))
    else:
        ctx.say("no consumers (no worker has read the stream yet)")
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

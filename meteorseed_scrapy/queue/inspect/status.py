"""The one reader of a namespace's queue: a typed :class:`QueueStatus` snapshot for
``meteorseed status``, the API and console (``GET /status``) and the metrics endpoint (the
worker's idle check reads the cheap part of it:
:func:`~meteorseed_scrapy.queue.consume.group.quiet_plan`).

Each is a read plan (:mod:`meteorseed_scrapy.queue.plumbing.reads`), so the CLI's synchronous client
and the asyncio ones run the same code, on one Redis or a cluster.

Per shard, the length and pending count of every task stream, the delayed and dead counts and
the added counter are read in one MULTI (one slot on a cluster): ``backlog = length - pending``
is exact at one instant (workers XDEL an entry right after XACKing it, so XLEN counts waiting
plus pending entries), and so is ``finished = added - length - delayed``.

Throughput works on Redis 6.2 (whose XINFO STREAM has no ``entries-added``): the scripts that
add tasks to a shard's streams count them in ``<prefix>:counts`` (``lua/counts_lib.lua``), and
those that came back from a delayed set apart: ``added`` counts new tasks only, so a task
re-parked by its site's quota a hundred times is added once; tasks settled for good (acked,
dead-lettered) are ``added - length - delayed``.
:class:`Throughput` turns successive snapshots into rates.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.fleet.delayed import DelayedEntry
from meteorseed_scrapy.queue.fleet.snapshot import (
    ConsumerStatus,
    Depth,
    LaneStatus,
    QueueStatus,
    RedisMemory,
    ShardStatus,
    SiteThrottle,
    summarize_delayed,
)
from meteorseed_scrapy.queue.fleet.spiders import alive_consumers, spider_plan, spider_rows
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.queue.plumbing.reads import Batch, Plan, call, run_async, run_sync
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.task.lanes import BANDS, LANES

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis, SyncRedis

#: Delayed-set entries read per snapshot (the soonest due, shared between the shards) for the
#: breakdown by site and reason; the total and the next due time are exact at any size.
DELAYED_SCAN = 1000
#: Sites whose adaptive state a snapshot reads (the most recently active).
MAX_THROTTLES = 200


def _missing(reply: Any) -> bool:
    """A reply that says the stream or its group does not exist yet (nothing to count)."""
    return isinstance(reply, ResponseError) and (
        "NOGROUP" in str(reply) or "no such key" in str(reply))


def _int(reply: Any) -> int:
    if isinstance(reply, Exception):
        raise reply
    return int(reply or 0)


def _pending(reply: Any) -> int:
    if _missing(reply):
        return 0
    if isinstance(reply, Exception):
        raise reply
    if isinstance(reply, dict):
        return int(reply.get("pending") or 0)
    return int(reply[0] or 0) if reply else 0


def _counter(reply: Any) -> int | None:
    """New tasks from the counters' ``[added, readded]``; None when they cannot be read
    (throughput unknown, not wrong)."""
    if isinstance(reply, Exception) or not isinstance(reply, list) or len(reply) != 2:
        return None
    try:
        return int(reply[0] or 0) - int(reply[1] or 0)
    except ValueError:
        return None


def _listing(reply: Any) -> list[dict[Any, Any]]:
    """XINFO GROUPS/CONSUMERS rows ([] when the stream or group does not exist)."""
    if _missing(reply):
        return []
    if isinstance(reply, Exception):
        raise reply
    return [{text_of(k): v for k, v in row.items()} for row in reply or []]


def status_plan(keys: KeyLayout, delayed_scan: int = DELAYED_SCAN) -> Plan[QueueStatus]:
    """The namespace's spiders and workers (one round trip: :func:`spider_plan`), then three
    batches in one round trip (a MULTI per shard; consumers, delivery positions and the
    soonest delayed entries; Redis TIME), then one more for the lag when tasks wait."""
    keys, spider_workers, live = yield from spider_plan(keys)
    shards = keys.shard_keys
    # One Redis keeps every shard's dead letters in <ns>:dead: counted with the first shard.
    own_dead = [k == 0 or len(keys.deads) > 1 for k in range(len(shards))]
    batches = []
    for shard, own in zip(shards, own_dead, strict=True):
        calls = [c for s in shard.streams
                 for c in (call("xlen", s), call("xpending", s, keys.group))]
        calls += [call("zcard", d) for d in shard.delayeds]
        calls += [call("hmget", shard.counts, "added", "readded")]
        calls += [call("xlen", shard.dead)] if own else []
        batches.append(Batch(calls, transaction=True))
    sets = shards[0].task_sets
    per_set = max(1, math.ceil(delayed_scan / (len(shards) * len(sets))))  # >= 1: next due
    detail = [c for s in keys.streams
              for c in (call("xinfo_groups", s), call("xinfo_consumers", s, keys.group))]
    detail += [call("zrange", d, 0, per_set - 1, withscores=True)
               for shard in shards for d in shard.delayeds]
    replies = yield [*batches, Batch(detail),
                     Batch([call("time"), call("info", "memory")], direct=True)]
    counted, infos, (clock, memory) = replies[:len(shards)], replies[-2], replies[-1]
    if isinstance(clock, Exception):
        raise clock
    now = float(clock[0]) + float(clock[1]) / 1e6

    bands = {(lane, band): [0, 0] for lane in LANES for band in BANDS}
    by_set = {spider: [0, 0, 0] for spider in sets}  # backlog, pending, delayed
    rows, lengths = [], {}
    delayed_total = dead = 0
    added: int | None = 0
    for shard, own, reply in zip(shards, own_dead, counted, strict=True):
        n = len(shard.streams)
        backlog = pending = 0
        for i, stream in enumerate(shard.streams):
            length, held = _int(reply[2 * i]), _pending(reply[2 * i + 1])
            lengths[stream] = (length, held)
            depth = bands[shard.stream_lanes[stream]]
            depth[0] += max(0, length - held)
            depth[1] += held
            own_set = by_set[shard.stream_spiders[stream]]
            own_set[0] += max(0, length - held)
            own_set[1] += held
            backlog, pending = backlog + max(0, length - held), pending + held
        delays = [_int(r) for r in reply[2 * n: 2 * n + len(sets)]]
        for spider, count in zip(sets, delays, strict=True):
            by_set[spider][2] += count
        delayed, counter = sum(delays), _counter(reply[2 * n + len(sets)])
        shard_dead = _int(reply[2 * n + len(sets) + 1]) if own else 0
        added = None if added is None or counter is None else added + counter
        delayed_total, dead = delayed_total + delayed, dead + shard_dead
        rows.append(ShardStatus(shard.index, shard.stream, backlog, pending, delayed,
                                shard_dead if len(keys.deads) > 1 else None))

    consumers: dict[str, tuple[int, float]] = {}  # name -> pending, least idle (s)
    waiting: list[tuple[str, str]] = []  # (stream, last delivered id) of streams with a backlog
    for i, stream in enumerate(keys.streams):
        groups, members = _listing(infos[2 * i]), _listing(infos[2 * i + 1])
        length, held = lengths[stream]
        if length > held:
            group = next((g for g in groups if text_of(g.get("name")) == keys.group), {})
            waiting.append((stream, text_of(group.get("last-delivered-id") or "0-0")))
        for c in members:
            name, idle = text_of(c["name"]), int(c.get("idle") or 0) / 1000
            before = consumers.get(name, (0, idle))
            consumers[name] = (before[0] + int(c.get("pending") or 0), min(before[1], idle))
    scanned = infos[2 * len(keys.streams):]
    for reply in scanned:
        if isinstance(reply, Exception):
            raise reply
    entries = [[DelayedEntry.parse(member, float(score)) for member, score in reply]
               for reply in scanned]

    lane_of = {s: lane for s, (lane, _band) in keys.stream_lanes.items()}
    (firsts,) = yield [
        Batch([call("xrange", stream, f"({last}", "+", count=1) for stream, last in waiting])]
    lane_lag: dict[str, float] = {}
    for (stream, _last), first in zip(waiting, firsts, strict=True):
        if isinstance(first, list) and first:
            age = max(0.0, now - int(text_of(first[0][0]).split("-", 1)[0]) / 1000)
            lane = lane_of[stream]
            lane_lag[lane] = max(age, lane_lag.get(lane, 0.0))
    lag = max(lane_lag.values(), default=0.0)

    throttles = yield from _throttles(keys, now)
    return QueueStatus(
        namespace=keys.namespace, stream=shards[0].stream, at=now, throttles=throttles,
        lanes={lane: LaneStatus({band: Depth(*bands[lane, band]) for band in BANDS})
               for lane in LANES},
        shards=tuple(rows),
        consumers=tuple(ConsumerStatus(name, held, idle, now - idle)
                        for name, (held, idle) in sorted(consumers.items())),
        delayed=summarize_delayed(delayed_total, entries),
        dead=dead, added=added, lag_s=lag, lane_lag_s=lane_lag,
        live_workers=None if live is None else len(alive_consumers(live, now)),
        memory=RedisMemory.parse(memory),
        spiders=spider_rows(by_set, spider_workers, live, now),
    )


def _throttles(keys: KeyLayout, now: float) -> Plan[tuple[SiteThrottle, ...]]:
    """The adaptive state and robots.txt cap of the sites the index lists (the most recently
    flushed first): an index read, then one round trip for them all."""
    (listed,) = yield [Batch([call("zrevrange", keys.adaptive_sites, 0, MAX_THROTTLES - 1)])]
    (quotas,) = listed
    if isinstance(quotas, Exception) or not quotas:
        return ()  # (an index Redis refuses hides the table, not the rest of the status)
    quotas = [text_of(q) for q in quotas]
    calls = []
    for quota in quotas:
        calls += [call("hmget", keys.site(quota, "adaptive"), "delay", "latency"),
                  call("zcount", keys.site(quota, "leases"), int(now * 1000), "+inf"),
                  call("hvals", keys.site(quota, "robots"))]
    (replies,) = yield [Batch(calls)]
    rows = []
    for i, quota in enumerate(quotas):
        state, leases, robots = replies[3 * i: 3 * i + 3]
        delay, latency = (state if isinstance(state, list) else [None, None])
        intervals = [_ms(v) for v in robots] if isinstance(robots, list) else []
        longest = max((x for x in intervals if x), default=None)
        rows.append(SiteThrottle(quota, _ms(delay), _ms(latency),
                                 leases if isinstance(leases, int) else 0, longest))
    return tuple(rows)


def _ms(value: Any) -> float | None:
    """Seconds from a ms figure the scripts wrote (None: absent or not a finite number)."""
    try:
        ms = float(text_of(value)) if value is not None else math.nan
    except ValueError:
        return None
    return ms / 1000 if math.isfinite(ms) and ms >= 0 else None


def read_status(client: SyncRedis, keys: KeyLayout, delayed_scan: int = DELAYED_SCAN
                ) -> QueueStatus:
    """A snapshot on a synchronous client (the CLI)."""
    return run_sync(client, status_plan(keys, delayed_scan))


class QueueSampler:
    """Snapshots of one namespace on an asyncio client (its own unless ``client`` is given)."""

    def __init__(self, redis_url: str, keys: KeyLayout, client: AsyncRedis | None = None, *,
                 delayed_scan: int = DELAYED_SCAN) -> None:
        self.keys = keys
        self.delayed_scan = delayed_scan
        self._own = client is None
        self.redis = client or async_client(
            redis_url, decode_responses=True, socket_timeout=5, socket_connect_timeout=5,
        )

    async def sample(self) -> QueueStatus:
        return await run_async(self.redis, status_plan(self.keys, self.delayed_scan))

    async def close(self) -> None:
        if self._own:
            await self.redis.aclose()


class Throughput:
    """New tasks added and tasks settled for good per second, over the snapshots of the last
    ``window_s`` seconds (the growth of ``added`` and of ``finished``: a task re-parked by its
    site's quota counts in neither)."""

    def __init__(self, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._samples: deque[tuple[float, int, int]] = deque()  # (t, added, finished)

    def update(self, status: QueueStatus) -> dict[str, Any]:
        out: dict[str, Any] = {"added_per_s": None, "finished_per_s": None, "over_s": 0.0,
                               "added_total": status.added, "finished_total": status.finished}
        if status.added is None:
            self._samples.clear()
            return out
        now, left = self.clock(), status.added - status.length - status.delayed.total
        if self._samples and status.added < self._samples[-1][1]:
            self._samples.clear()  # the counter went back: the namespace was reset
        self._samples.append((now, status.added, left))
        # Snapshots older than the window go, even the last one before it: a console polled
        # once in a while shows no rate rather than one over ten minutes.
        while len(self._samples) > 1 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        then, added0, left0 = self._samples[0]
        span = now - then
        if span > 0:
            # (never negative: tasks added by a writer that does not count them, by hand or
            # by an older version, would otherwise show as "unfinished")
            out.update(added_per_s=round((status.added - added0) / span, 2),
                       finished_per_s=round(max(0, left - left0) / span, 2),
                       over_s=round(span, 1))
        return out


__all__ = ["DELAYED_SCAN", "QueueSampler", "Throughput", "read_status",
           "status_plan"]

"""The delayed set: tasks parked until they are due (a retry's backoff, a site's quota, a paused
site), owned here and changed only through these verbs.

- :meth:`DelayedSet.defer`: ack a delivered message and park its task, atomically
  (``lua/defer.lua``), in its task set's delayed set (only its spider's workers promote it);
- :meth:`DelayedSet.promote`: move due tasks back to their streams (``lua/promote.lua``);
- :func:`make_due`: make the parked tasks that match due now, keeping their route and message
  (a synchronous client, as the CLI has); :func:`wake_parked` does it in passes, for an
  operator's resume of a seed or a site (:data:`RESUME_PASSES_S`, :data:`STALE_VIEW_S`).

The members and scores are read by :mod:`meteorseed_scrapy.queue.fleet.delayed`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.fleet.delayed import SCALE, reason_code, reason_of
from meteorseed_scrapy.queue.fleet.spiders import with_registered_sync
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.shards import call_scripts
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.task.lanes import DEFAULT_LANE, band_of

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis, SyncRedis

#: Delayed-set members per ZSCAN page in :func:`make_due`.
SCAN_COUNT = 500
#: A resume of a held seed or site makes its parked tasks due at once, and again after these
#: pauses (seconds): a worker that saw the hold just before the resume parks the tasks it
#: holds a moment later, and its parking reaches Redis with its next writes.
RESUME_PASSES_S = (0.0, 1.0, 2.0)
#: A worker whose view of a hold (a seed's or a site's) is older than this when it parks (its
#: event loop was blocked, or Redis slow) parks the held tasks only for :data:`STALE_PARK_S`:
#: a resume made meanwhile may have ended its passes before they were parked, and must not
#: leave them parked for the hold's hour.
STALE_VIEW_S = 1.0
STALE_PARK_S = 5.0


class DelayedSet:
    """A worker's verbs on its namespace's delayed sets (every shard, its task sets)."""

    def __init__(self, redis: AsyncRedis, keys: KeyLayout) -> None:
        self.redis = redis
        self.keys = keys
        self._defer = scripts.register(redis, "defer")
        self._promote = scripts.register(redis, "promote")

    async def defer(self, ref: tuple[str, str], task: ExecTask, delay_s: float,
                    lane: str = "", why: DeferReason = DeferReason.OTHER, owner: str = "") -> bool:
        """Ack the message ``ref`` (stream, id) and put ``task`` in the delayed set, due in
        ``delay_s`` (Redis time), for the task stream of ``lane`` ("" = the task's own);
        ``why`` is recorded with it (``meteorseed status`` counts them by reason). With
        ``owner``, only while the entry is still pending on that consumer; False when not."""
        route = f"{lane or task.lane}:{band_of(task.priority)}"
        shard = self.keys.shard_of_stream(ref[0])
        done = await self._defer(  # (in its task set's delayed set: its spider's workers only)
            keys=[ref[0], shard.delayed_of(shard.stream_spiders[ref[0]])],
            args=[self.keys.group, ref[1], int(delay_s * 1000), f"{route}|{task.to_message()['t']}",
                  "1", reason_code(why), owner, task.seed_id, task.site_id],
        )
        return bool(done)

    async def promote(self, limit: int = 500) -> float:
        """Move due tasks to their streams (each shard's delayed set to that shard's streams);
        returns seconds until the next is due (-1: none)."""
        calls = []
        for shard in self.keys.shard_keys:
            for spider in shard.task_sets:  # each task set's delayed set to its own streams
                streams = shard.set_streams(spider)
                routes = [":".join(shard.stream_lanes[s]) for s in streams]
                calls.append(([shard.delayed_of(spider), *streams],
                              [limit, MESSAGE_VERSION, streams.index(shard.task_stream(
                                  DEFAULT_LANE, "normal", spider)) + 1, *routes]))
        waits = []
        for moved, wait_ms in await call_scripts(self.redis, self._promote, calls):
            if int(moved) >= limit:
                return 0.0
            if int(wait_ms) >= 0:
                waits.append(int(wait_ms) / 1000)
        return min(waits, default=-1.0)


def make_due(client: SyncRedis, keys: KeyLayout, why: DeferReason,
             matches: Callable[[Any], bool]) -> int:
    """Make the tasks parked for ``why`` whose member ``matches`` due now (their due time only:
    they keep their route and message), in every shard and task set; returns how many. A member
    that leaves meanwhile stays gone."""
    code = reason_code(why)
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    due = now_ms - 1 + code / SCALE  # (defer.lua's encoding: the reason in the fraction)
    woken = 0
    every = with_registered_sync(client, keys)  # each spider's task set has a delayed set too
    for delayed in (d for shard in every.shard_keys for d in shard.delayeds):
        batch: dict[Any, float] = {}
        for member, score in client.zscan_iter(delayed, count=SCAN_COUNT):
            if score > due and reason_of(score) == why.value and matches(member):
                batch[member] = due
            if len(batch) >= SCAN_COUNT:
                woken, batch = woken + _move(client, delayed, batch), {}
        woken += _move(client, delayed, batch)
    return woken


def wake_parked(client: SyncRedis, keys: KeyLayout, why: DeferReason,
                matches: Callable[[Any], bool]) -> int:
    """:func:`make_due` in :data:`RESUME_PASSES_S` passes (the call takes their 3 s); returns
    how many were made due in all."""
    woken = 0
    for wait in RESUME_PASSES_S:
        time.sleep(wait)
        woken += make_due(client, keys, why, matches)
    return woken


def _move(client: SyncRedis, key: str, batch: dict[Any, float]) -> int:
    return int(client.zadd(key, batch, xx=True, ch=True) or 0) if batch else 0


__all__ = ["RESUME_PASSES_S", "SCAN_COUNT", "STALE_PARK_S", "STALE_VIEW_S", "DelayedSet",
           "make_due", "wake_parked"]

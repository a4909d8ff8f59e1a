"""A crawl's progress: per-seed (and per-site) counters, written by the scripts that enqueue and
settle tasks (``lua/progress_lib.lua``), read here.

Counting costs no round trip of its own: ``enqueue.lua`` counts ``enqueued`` (children too,
since they are written with their parent's ``seed_id``), ``ack.lua`` ``done`` with the items,
anomalies and bytes the task left, ``dead.lua`` ``dead``, ``defer.lua``/``promote.lua`` the
``delayed`` tasks, ``requeue.lua`` a dead letter enqueued again, ``seed_cancel.lua`` the
``cancelled`` tasks of a cancelled seed (:mod:`~meteorseed_scrapy.queue.consume.seed_control`).
``outstanding`` is enqueued - (done + dead + cancelled); when a settle brings it to zero the
seed is finished: ``finished_at`` is set, the counters expire after
``METEORSEED_SEED_PROGRESS_RETENTION`` and a ``finished`` event (with the counters as JSON)
goes to ``<ns>:events``. The next task enqueued for a finished seed (a scheduled seed's next
run, a requeued dead letter) starts a new run: the counters restart, the last run's final ones
are kept (``last_<name>`` fields, shown as ``previous``).

Each shard of a sharded layout keeps its own hash (``<ns>:{s<k>}:crawl:<seed>``, in the slot of
the streams its scripts touch): they are summed here, and the end is judged here too
(:func:`finish_if_done`), since one shard reaching zero says nothing of the others. There the
shard scripts tell no event (the events stream is in another slot): ``started`` is told by the
writer after an enqueue (:func:`tell_started`), ``finished`` by :func:`finish_if_done`, each
once per run through a marker in the events stream's slot (``lua/tell_once.lua``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.replies import text_of

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import (
        AsyncPipeline,
        AsyncRedis,
        SyncPipeline,
        SyncRedis,
    )
    from meteorseed_scrapy.task.exec_task import ExecTask

__all__ = ["COUNTERS", "Settle", "ack_args", "enqueued_seeds", "events_key",
           "finish_if_done", "finish_if_done_sync", "merge", "owner_line", "read_progress",
           "read_progress_sync", "read_site_totals", "seed_keys", "settle_acks", "tell_started",
           "tell_started_sync", "told_key"]

#: The counters of a seed (and a site), in the order they are shown.
COUNTERS = ("enqueued", "done", "dead", "cancelled", "delayed", "waiting", "items", "anomalies",
            "bytes")


class Settle(NamedTuple):
    """What a settled task counts for: its seed and site, and what it left."""

    seed: str = ""
    site: str = ""
    items: int = 0
    anomalies: int = 0
    bytes: int = 0

    @classmethod
    def of(cls, task: ExecTask | None) -> Settle:
        """What an ack without a scrape of its own counts for: its task's seed and site."""
        return cls(task.seed_id, task.site_id) if task is not None else cls()


def owner_line(seed: str, site: str) -> str:
    """Whom an enqueued task counts for, as ``enqueue.lua`` takes it (ids hold no whitespace:
    a tab parts them)."""
    return f"{seed}\t{site}"


def ack_args(msg_id: str, settle: Settle | None) -> list[Any]:
    """``ack.lua``'s six values for one entry."""
    s = settle or Settle()
    return [msg_id, s.seed, s.site, s.items, s.anomalies, s.bytes]


async def settle_acks(redis: AsyncRedis, keys: KeyLayout, replies: Sequence[Any], retention: int
                      ) -> int:
    """How many entries ``ack.lua``'s ``replies`` acked; on a tagged layout, the seeds they
    brought to zero in a shard are finished when nothing of them is left anywhere
    (:func:`finish_if_done`; one Redis: the script judged it)."""
    acked, zeroed = 0, set[str]()
    for n, seeds in replies:
        acked += int(n)
        zeroed.update(text_of(seed) for seed in seeds)
    if zeroed and keys.tagged:
        await finish_if_done(redis, keys, sorted(zeroed), retention)
    return acked


def events_key(keys: KeyLayout) -> str:
    """The events stream the scripts write to: none on a tagged layout (a script may touch
    one slot only, and one shard's end is not the seed's)."""
    return "" if keys.tagged else keys.events


def seed_keys(keys: KeyLayout, seed_id: str) -> list[str]:
    """The seed's counter hash in every shard."""
    return [shard.crawl(seed_id) for shard in keys.shard_keys]


def _number(value: Any) -> float | int:
    text = text_of(value)
    try:
        return int(text)
    except ValueError:
        return float(text)


def merge(seed_id: str, hashes: Sequence[Mapping[Any, Any]]) -> dict[str, Any] | None:
    """One seed's progress from its hash in each shard (HGETALL replies); None when no shard
    has counted anything of it (never enqueued, or expired after it finished)."""
    found = [{text_of(k): v for k, v in h.items()} for h in hashes if h]
    if not found:
        return None
    total: dict[str, Any] = {name: 0 for name in
                             ("enqueued", "done", "dead", "cancelled", "delayed", "outstanding",
                              "items", "anomalies", "bytes")}
    for h in found:
        for name in total:
            if name in h:
                total[name] += int(_number(h[name]))
    started = [float(_number(h["started_at"])) for h in found if "started_at" in h]
    finished = [float(_number(h["finished_at"])) for h in found if "finished_at" in h]
    # (held by its expansion: more of its URLs to come)
    expanding = any("expanding" in h for h in found)
    done = len(finished) == len(found) and total["outstanding"] <= 0 and not expanding
    runs = [int(_number(h["run"])) for h in found if "run" in h]
    # The last run's final counters (fields last_<name>; summed over the shards that kept them).
    previous: dict[str, Any] = {}
    for h in found:
        for field, value in h.items():
            if field.startswith("last_"):
                name, number = field[5:], _number(value)
                if name in ("started_at", "finished_at"):
                    previous[name] = max(previous.get(name, number), number)
                else:
                    previous[name] = previous.get(name, 0) + number
    return {
        "seed_id": seed_id,
        "state": "finished" if done else "running",
        **{name: total[name] for name in ("enqueued", "done", "dead", "cancelled", "delayed")},
        # Waiting in a stream or being fetched: what is neither settled nor delayed.
        "waiting": max(0, total["outstanding"] - total["delayed"]),
        "outstanding": max(0, total["outstanding"]),
        **{name: total[name] for name in ("items", "anomalies", "bytes")},
        "started_at": min(started) if started else None,
        "finished_at": max(finished) if done else None,
        "run": max(runs) if runs else 1,
        "expanding": expanding,
        "previous": previous or None,
    }


async def read_progress(redis: AsyncRedis, keys: KeyLayout, seed_ids: Iterable[str]
                        ) -> dict[str, dict[str, Any] | None]:
    """Each seed's progress (:func:`merge`), read in one round trip (an asyncio client)."""
    ids = list(seed_ids)
    async with redis.pipeline(transaction=False) as pipe:
        for seed_id in ids:
            for key in seed_keys(keys, seed_id):
                pipe.hgetall(key)
        replies = await pipe.execute()
    n = len(keys.shard_keys)
    return {seed_id: merge(seed_id, replies[i * n:(i + 1) * n]) for i, seed_id in enumerate(ids)}


def read_progress_sync(redis: SyncRedis, keys: KeyLayout, seed_ids: Iterable[str]
                       ) -> dict[str, dict[str, Any] | None]:
    """:func:`read_progress` on a blocking client (the CLI's)."""
    ids = list(seed_ids)
    pipe = redis.pipeline(transaction=False)
    for seed_id in ids:
        for key in seed_keys(keys, seed_id):
            pipe.hgetall(key)
    replies = pipe.execute()
    n = len(keys.shard_keys)
    return {seed_id: merge(seed_id, replies[i * n:(i + 1) * n]) for i, seed_id in enumerate(ids)}


async def read_site_totals(redis: AsyncRedis, keys: KeyLayout, site_id: str) -> dict[str, int]:
    """A site's totals (the same counters, no finished state), from its shard."""
    raw = await redis.hgetall(keys.for_site(site_id).crawl_site(site_id))
    counts = {text_of(k): int(_number(v)) for k, v in raw.items()}
    out = {name: counts.get(name, 0) for name in ("enqueued", "done", "dead", "cancelled",
                                                  "delayed", "items", "anomalies", "bytes")}
    out["waiting"] = max(0, counts.get("outstanding", 0) - out["delayed"])
    return out


def told_key(keys: KeyLayout, seed_id: str) -> str:
    """What was told last of the seed on a tagged layout (``lua/tell_once.lua``): in the events
    stream's slot (its name is the hash tag), under the namespace (``reset`` finds it)."""
    return f"{keys.events}:{{{keys.events}}}:told:{seed_id}"


def _tell_call(keys: KeyLayout, event: str, told: Mapping[str, str | None], now: str,
               retention: int) -> tuple[list[str], list[Any]]:
    """``tell_once.lua``'s keys and arguments: ``told`` maps each seed to its counters (JSON,
    for ``finished``) or None (``started``)."""
    args: list[Any] = [event, now, retention]
    for seed_id, counters in told.items():
        args += [seed_id] if counters is None else [seed_id, counters]
    return [keys.events, *(told_key(keys, s) for s in told)], args


def _ending(progress: Mapping[str, dict[str, Any] | None]) -> dict[str, str]:
    """The seeds of ``progress`` with nothing left anywhere, each with its final counters."""
    return {seed_id: json.dumps(progress_counters(p)) for seed_id, p in progress.items()
            if p is not None and p["outstanding"] <= 0 and not p["expanding"]
            and p["state"] != "finished"}


def _mark_finished(pipe: SyncPipeline | AsyncPipeline, keys: KeyLayout, seeds: Iterable[Any],
                   now: str, retention: int) -> None:
    for seed in seeds:
        for key in seed_keys(keys, text_of(seed)):
            pipe.hset(key, "finished_at", now)
            if retention > 0:
                pipe.expire(key, retention)


async def finish_if_done(redis: AsyncRedis, keys: KeyLayout, seed_ids: Iterable[str],
                         retention: int) -> list[str]:
    """On a tagged layout, the seeds of ``seed_ids`` (whose outstanding count reached zero in
    one shard) that have nothing left in any shard: a ``finished`` event, told once per run
    (``lua/tell_once.lua``: two workers settling a seed's last tasks in two shards at once
    both come here), then each shard's hash gets ``finished_at`` and the expiry. Returns the
    seeds told."""
    ending = _ending(await read_progress(redis, keys, seed_ids))
    if not ending:
        return []
    now = f"{time.time():.3f}"
    told = await scripts.register(redis, "tell_once")(
        *_tell_call(keys, "finished", ending, now, retention))
    async with redis.pipeline(transaction=False) as pipe:
        _mark_finished(pipe, keys, told, now, retention)
        await pipe.execute()
    return [text_of(s) for s in told]


def finish_if_done_sync(redis: SyncRedis, keys: KeyLayout, seed_ids: Iterable[str],
                        retention: int) -> list[str]:
    """:func:`finish_if_done` on a blocking client (the CLI's)."""
    ending = _ending(read_progress_sync(redis, keys, seed_ids))
    if not ending:
        return []
    now = f"{time.time():.3f}"
    told = scripts.register(redis, "tell_once")(
        *_tell_call(keys, "finished", ending, now, retention))
    pipe = redis.pipeline(transaction=False)
    _mark_finished(pipe, keys, told, now, retention)
    pipe.execute()
    return [text_of(s) for s in told]


def tell_started_sync(redis: SyncRedis, keys: KeyLayout, seed_ids: Iterable[str],
                      retention: int) -> list[str]:
    """:func:`tell_started` on a blocking client (a requeue of dead letters by the CLI)."""
    ids = sorted(set(seed_ids) - {""})
    if not keys.tagged or not ids:
        return []
    told = [text_of(s) for s in scripts.register(redis, "tell_once")(
        *_tell_call(keys, "started", dict.fromkeys(ids), f"{time.time():.3f}", retention))]
    if told:
        finish_if_done_sync(redis, keys, told, retention)
    return told


def enqueued_seeds(owners: Iterable[str], fresh: Iterable[bool],
                   holds: Mapping[str, bool] | None) -> set[str]:
    """The seeds an enqueue started, maybe: those of the tasks it enqueued (``owners``: their
    :func:`owner_line`, ``fresh``: enqueued or not) and those its expansion holds."""
    seeds = {owner.partition("\t")[0] for owner, new in zip(owners, fresh, strict=True) if new}
    return seeds | {seed for seed, held in (holds or {}).items() if held}


async def tell_started(redis: AsyncRedis, keys: KeyLayout, seed_ids: Iterable[str],
                       retention: int) -> list[str]:
    """On a tagged layout, after an enqueue: ``started`` for the seeds of ``seed_ids`` not yet
    told started in this run (once: ``lua/tell_once.lua``). A seed whose last task settled
    before this was told is finished here (its end was not told without its start)."""
    ids = sorted(set(seed_ids) - {""})
    if not keys.tagged or not ids:
        return []
    told = [text_of(s) for s in await scripts.register(redis, "tell_once")(
        *_tell_call(keys, "started", dict.fromkeys(ids), f"{time.time():.3f}", retention))]
    if told:
        await finish_if_done(redis, keys, told, retention)
    return told


def progress_counters(progress: Mapping[str, Any]) -> dict[str, Any]:
    """The counters of a progress record, as a ``finished`` event carries them."""
    return {name: progress[name] for name in (*COUNTERS, "started_at", "finished_at", "run")
            if name in progress}

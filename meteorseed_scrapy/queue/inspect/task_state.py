"""Where is a task? Its whole state in one answer, read from where each state lives: the one
reader behind ``meteorseed task``, ``GET /tasks`` and the console (docs/tasks.md).

Bounded per lookup, per shard (:mod:`~meteorseed_scrapy.queue.keys` documents every key):
workers XDEL an entry once acked, so a task stream's entries up to the group's
``last-delivered-id`` are the pending ones (the oldest :data:`PENDING_SCAN`, then XPENDING of
a match) and the next :data:`WAITING_SCAN` after it the head of the line; the delayed set by
ZSCAN (:data:`DELAYED_ROUNDS` x :data:`DELAYED_COUNT`, MATCH on the task id or site); the newest
:data:`DEAD_SCAN` dead letters; GET of the completion record and failure note; the dedup
record by ``lua/dedup_when.lua``. Each search says what it read and whether that was all, so
"not found" is never claimed past a scan cut short. Entries are compared once decoded (task
id, or the writer's fingerprint), never on raw text; each reply becomes a place of the answer
in :mod:`.task_places`.
"""

from __future__ import annotations

import json
from typing import Any

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.fleet.spiders import registered_plan
from meteorseed_scrapy.queue.inspect.task_places import (
    decode_task,
    record_dead,
    record_dedup,
    record_delayed,
    record_delivery,
    record_done,
    record_history,
    record_pending,
    record_waiting,
)
from meteorseed_scrapy.queue.inspect.task_query import Search, TaskQuery, TaskState
from meteorseed_scrapy.queue.keys import KeyLayout, ShardKeys
from meteorseed_scrapy.queue.plumbing.reads import Batch, Plan, call
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.queue.plumbing.scripts import script_source
from meteorseed_scrapy.queue.scan import glob_escape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError, check_id

#: Entries read per task stream up to the last delivered one (the pending ones, oldest first):
#: pending entries are bounded by the workers' prefetch, so this is normally all of them.
PENDING_SCAN = 1000
#: Entries read per task stream after the last delivered one: the next to be delivered.
WAITING_SCAN = 1000
#: ZSCAN calls per delayed set, and the COUNT hint of each.
DELAYED_ROUNDS = 10
DELAYED_COUNT = 1000
#: Newest dead letters read per dead-letter stream.
DEAD_SCAN = 1000
#: Sites whose dedup roots a URL query without a site consults (from the seed registry and
#: the pushed rule files).
SITE_CANDIDATES = 50


def _ok(reply: Any) -> Any:
    """A reply, or None for a missing stream/group; other errors raise."""
    if isinstance(reply, ResponseError) and ("NOGROUP" in str(reply)
                                             or "no such key" in str(reply)):
        return None
    if isinstance(reply, Exception):
        raise reply
    return reply


def _last_delivered(groups: Any, group: str) -> str | None:
    for row in _ok(groups) or []:
        row = {text_of(k): v for k, v in row.items()}
        if text_of(row.get("name")) == group:
            return text_of(row.get("last-delivered-id") or "0-0")
    return None


def task_state_plan(keys: KeyLayout, query: TaskQuery) -> Plan[TaskState]:
    """Read plan of a query's :class:`TaskState` (run it with ``run_sync``/``run_async``)."""
    keys = yield from registered_plan(keys)  # (every spider's task set is searched too)
    shards = [keys.for_site(query.site_id)] if query.site_id else list(keys.shard_keys)
    streams = [s for shard in shards for s in shard.streams]
    deads = list(dict.fromkeys(shard.dead for shard in shards))
    first = [c for s in streams for c in (call("xinfo_groups", s), call("xlen", s))]
    first += [call("xrevrange", d, "+", "-", count=DEAD_SCAN) for d in deads]
    first += [call("xlen", d) for d in deads]
    if query.task_id is not None:
        first += [c for shard in shards
                  for c in (call("get", shard.done(query.task_id)),
                            call("get", shard.failed(query.task_id)))]
    want_sites = query.site_id is None and query.url is not None
    if want_sites:
        first += [call("zrangebylex", keys.seeds_by_site, "-", "+", 0, SITE_CANDIDATES * 20),
                  call("hscan", keys.sites, 0, count=SITE_CANDIDATES)]
    replies, (clock,) = yield [Batch(first), Batch([call("time")], direct=True)]
    it = iter(replies)
    clock = _ok(clock)
    state = TaskState(query, float(clock[0]) + float(clock[1]) / 1e6)
    infos = {s: (_last_delivered(next(it), keys.group), int(_ok(next(it)) or 0))
             for s in streams}
    dead_pages = [_ok(next(it)) or [] for _ in deads]
    dead_lengths = [int(_ok(next(it)) or 0) for _ in deads]
    if query.task_id is not None:
        for shard in shards:
            record_done(state, shard, _ok(next(it)))
            note = _ok(next(it))
            if note:
                state.record_failure(text_of(note))
    candidates: list[str] = []
    if want_sites:
        by_site, (_, pushed) = _ok(next(it)) or [], _ok(next(it)) or (0, {})
        candidates = [text_of(m).split("\t", 1)[0] for m in by_site]
        candidates += [text_of(k) for k in pushed]
    for dead, page, length in zip(deads, dead_pages, dead_lengths, strict=True):
        record_dead(state, keys, dead, page)
        state.record_search(Search(dead, f"XREVRANGE + - COUNT {DEAD_SCAN}", len(page),
                                   len(page) >= length))

    second: list[Any] = []
    for s in streams:
        last, _ = infos[s]
        if last is not None:
            second.append(call("xrange", s, "-", last, count=PENDING_SCAN))
            second.append(call("xrange", s, f"({last}", "+", count=WAITING_SCAN))
        else:  # no consumer group yet: every entry waits
            second.append(call("xrange", s, "-", "+", count=WAITING_SCAN))
    (pages,) = yield [Batch(second)]
    pages_it = iter(pages)
    pending_hits: list[tuple[str, str, ExecTask]] = []
    for s in streams:
        last, length = infos[s]
        lane, band = keys.stream_lanes[s]
        read = 0
        if last is not None:
            delivered = _ok(next(pages_it)) or []
            read += len(delivered)
            for entry_id, fields in delivered:
                task = decode_task(fields)
                if task is not None and query.matches(task):
                    pending_hits.append((s, text_of(entry_id), task))
        waiting = _ok(next(pages_it)) or []
        read += len(waiting)
        for ahead, (entry_id, fields) in enumerate(waiting):
            task = decode_task(fields)
            if task is not None and query.matches(task):
                record_waiting(state, s, (lane, band), text_of(entry_id), ahead, task)
        how = (f"XRANGE - {last} COUNT {PENDING_SCAN}, XRANGE ({last} + COUNT {WAITING_SCAN}"
               if last is not None else f"XRANGE - + COUNT {WAITING_SCAN}")
        state.record_search(Search(s, how, read, read >= length))

    pending_places = [record_pending(state, keys, s, entry_id, task)
                        for s, entry_id, task in pending_hits]
    yield from _delayed(state, keys, shards, query)  # (before dedup: its tasks' sites count)
    third = [call("xpending_range", s, keys.group, entry_id, entry_id, 1)
             for s, entry_id, _ in pending_hits]
    sites = _sites_to_check(state, query, candidates)
    # (EVAL direct: a cluster pipeline has no EVAL; each call goes to its root's node)
    scripts = [c for site in sites for c in (
        call("eval", script_source("dedup_when"), 1, keys.seen(site), "",
             _fingerprint(state, query, site)),
        call("eval", script_source("history_get"), 1, keys.history(site),
             _fingerprint(state, query, site)))]
    delivered, replies = yield [Batch(third), Batch(scripts, direct=True)]
    for number, reply in zip(pending_places, delivered, strict=True):
        record_delivery(state, number, _ok(reply) or [])
    for site, dedup, history in zip(sites, replies[::2], replies[1::2], strict=True):
        record_dedup(state, site, keys.seen(site), _ok(dedup))
        record_history(state, site, keys.history(site), _ok(history))
    if query.url is not None:
        state.add_note("a URL is found by its GET fingerprint; a task with another method "
                       "or a body, and its completion record, are found by task id")
    return state


def _fingerprint(state: TaskState, query: TaskQuery, site: str) -> bytes:
    if query.fingerprint:
        return query.fingerprint
    for place in state.places:  # a task-id query: the fingerprint of the task found
        task = place.get("task")
        if task and task.get("site_id") == site:
            try:
                return query.fingerprint_of(ExecTask.from_dict(task))
            except ValueError:
                continue
    return b""


def _sites_to_check(state: TaskState, query: TaskQuery, candidates: list[str]) -> list[str]:
    found = [p["task"]["site_id"] for p in state.places if p.get("task")]
    sites = [query.site_id] if query.site_id else []
    if query.task_id is None:
        sites += found + candidates
    else:
        sites += found
    out: list[str] = []
    for site in dict.fromkeys(sites):
        try:
            out.append(check_id("site_id", site))
        except TaskError:
            continue
    if len(out) > SITE_CANDIDATES:
        state.add_note(f"dedup checked for the first {SITE_CANDIDATES} of {len(out)} "
                       "sites: pass the site to check another")
    out = out[:SITE_CANDIDATES]
    if query.task_id is not None:
        out = [s for s in out if _fingerprint(state, query, s)]
    return out


def _delayed(state: TaskState, keys: KeyLayout, shards: list[ShardKeys], query: TaskQuery
             ) -> Plan[None]:
    """ZSCAN of each shard's delayed set, :data:`DELAYED_ROUNDS` calls at most."""
    if query.task_id is not None:
        needle = json.dumps(query.task_id, ensure_ascii=False)[1:-1]
    elif query.site_id is not None:
        needle = '"site_id":' + json.dumps(query.site_id, ensure_ascii=False)
    else:
        needle = ""
    match = f"*{glob_escape(needle)}*" if needle else None
    cursors: dict[str, int | None] = {d: 0 for shard in shards for d in shard.delayeds}
    read = dict.fromkeys(cursors, 0)
    (sizes,) = yield [Batch([call("zcard", key) for key in cursors])]
    for _ in range(DELAYED_ROUNDS):
        live = [key for key, cursor in cursors.items() if cursor is not None]
        if not live:
            break
        (replies,) = yield [Batch([call("zscan", key, cursors[key], match=match,
                                        count=DELAYED_COUNT) for key in live])]
        for key, reply in zip(live, replies, strict=True):
            cursor, entries = _ok(reply) or (0, [])
            cursors[key] = int(cursor) or None
            read[key] += len(entries)
            for member, score in entries:
                record_delayed(state, key, text_of(member), float(score))
    for (key, cursor), size in zip(cursors.items(), sizes, strict=True):
        how = f"ZSCAN MATCH {match} COUNT {DELAYED_COUNT}" if match else \
            f"ZSCAN COUNT {DELAYED_COUNT}"
        state.record_search(Search(key, f"{how}, at most {DELAYED_ROUNDS} calls", read[key],
                                   cursor is None or not int(_ok(size) or 0)))


__all__ = ["DEAD_SCAN", "DELAYED_COUNT", "DELAYED_ROUNDS", "PENDING_SCAN", "SITE_CANDIDATES",
           "WAITING_SCAN", "task_state_plan"]

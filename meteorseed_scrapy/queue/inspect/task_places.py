"""How the Redis replies about a task become the places of its
:class:`~meteorseed_scrapy.queue.inspect.task_query.TaskState`: one verb per place (waiting,
pending,
delayed, dead, done) and for its delivery and dedup records. No I/O: :mod:`.task_state` plans
the reads and hands each reply here. A message that does not decode is no match, never an
error: the lookup reports what it can read.
"""

from __future__ import annotations

from typing import Any

from meteorseed_scrapy.queue.consume.deadletters import DeadLetter
from meteorseed_scrapy.queue.consume.task_history import decode_record
from meteorseed_scrapy.queue.fleet.delayed import DelayedEntry
from meteorseed_scrapy.queue.inspect.task_query import Place, TaskState
from meteorseed_scrapy.queue.keys import KeyLayout, ShardKeys
from meteorseed_scrapy.queue.plumbing.replies import record_of, text_of
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError


def decode_task(fields: Any) -> ExecTask | None:
    try:
        return ExecTask.from_message(fields)
    except TaskError:
        return None


def _id_time(entry_id: Any) -> float:
    return int(text_of(entry_id).split("-", 1)[0]) / 1000


def record_waiting(state: TaskState, stream: str, route: tuple[str, str], entry_id: str,
                   ahead: int, task: ExecTask) -> None:
    """A task waiting in ``stream`` (of lane and band ``route``) behind ``ahead`` others."""
    lane, band = route
    state.add_place({"state": Place.WAITING.value, "stream": stream, "lane": lane, "band": band,
                     "entry_id": entry_id, "ahead": ahead,
                     "enqueued_at": _id_time(entry_id), "task": task.to_dict()})


def record_done(state: TaskState, shard: ShardKeys, reply: Any) -> None:
    if reply is None:
        return
    state.add_place({"state": Place.DONE.value, "key": shard.done(state.query.task_id or ""),
                     "record": record_of(reply)})


def record_dead(state: TaskState, keys: KeyLayout, dead: str, page: list[Any]) -> None:
    k = keys.deads.index(dead)
    for entry_id, fields in page:
        letter = DeadLetter.decode(text_of(entry_id), {text_of(a): text_of(b) for a, b in
                                                     fields.items()}, keys, k)
        if letter.task is not None and state.query.matches(letter.task):
            place = {"state": Place.DEAD.value, "stream": dead, **letter.summary()}
            place["task"] = letter.task.to_dict()
            state.add_place(place)


def record_pending(state: TaskState, keys: KeyLayout, stream: str, entry_id: str, task: ExecTask
                   ) -> int:
    """A task delivered from ``stream``: its place's number, for :func:`record_delivery`."""
    lane, band = keys.stream_lanes[stream]
    return state.add_place({"state": Place.PENDING.value, "stream": stream, "lane": lane,
                            "band": band, "entry_id": entry_id, "enqueued_at": _id_time(entry_id),
                            "task": task.to_dict()})


def record_delivery(state: TaskState, number: int, reply: list[Any]) -> None:
    """XPENDING of pending place ``number``: on which consumer, idle how long, delivered how
    often."""
    if reply:
        row = reply[0]
        state.record_delivery(number, text_of(row["consumer"]),
                              round(int(row["time_since_delivered"]) / 1000, 3),
                              int(row["times_delivered"]))
    else:  # acked between the two reads: its XDEL follows at once
        state.record_acked(number)


def record_dedup(state: TaskState, site: str, key: str, reply: Any) -> None:
    values = [int(v) for v in reply or [0]]
    row: dict[str, Any] = {"site_id": site, "key": key, "seen": len(values) > 1}
    if len(values) > 1:
        _, window, since, eligible = values[:4]
        row.update(window_s=window, seen_from=since if window else None,
                   eligible_at=eligible if window else None)
    state.add_dedup(row)


def record_history(state: TaskState, site: str, key: str, reply: Any) -> None:
    """``history_get.lua``'s reply for the URL under one site."""
    record = decode_record(reply)
    if record is not None:
        state.add_history({"site_id": site, "key": key, **record})


def record_delayed(state: TaskState, key: str, member: str, score: float) -> None:
    route, bar, message = member.partition("|")
    if not bar or member.startswith("{"):
        route, message = "scheduled:normal", member
    task = decode_task({"v": "1", "t": message})
    if task is None or not state.query.matches(task):
        return
    entry = DelayedEntry.parse(member, score)
    lane, _, band = route.partition(":")
    state.add_place({"state": Place.DELAYED.value, "key": key, "why": entry.why,
                     "due_at": entry.due_at, "to_lane": lane, "to_band": band,
                     "task": task.to_dict()})

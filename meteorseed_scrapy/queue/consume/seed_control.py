"""An operator's hand on a seed, fleet-wide: hold it (pause), let it go (resume), or cancel it.

- **Hold.** The seed in ``<ns>:seeds:held`` (who, when, why): every worker reads that set at
  least every :data:`POLL_S` (``worker/seed_holds.py``) and starts no task of the seed from
  then on; it parks the seed's tasks it holds in the delayed set (reason ``paused``, due in
  :data:`PARK_S`), as it parks a held site's.
  Nothing is lost: waiting tasks stay in their streams, in-flight requests finish, children
  carry their parent's ``seed_id`` and are held too.
- **Resume.** The seed leaves the set and its parked tasks are made due now, and again 1 s and
  3 s later (:func:`~meteorseed_scrapy.queue.consume.delayed_set.wake_parked`): a worker parks
  the seed's tasks until its next read of the holds.
- **Cancel.** The seed in ``<ns>:seeds:cancelled`` (a zset: seed -> when the mark lapses,
  :data:`CANCEL_RETENTION_S` on), then its tasks in the delayed sets and the entries of the
  streams no worker has read yet are removed, each counted ``cancelled`` in the seed's
  progress (``lua/seed_cancel.lua``) and recorded ``cancelled`` in the task history. A task a
  worker holds or reads later while the mark lasts is settled the same way without being
  fetched; one in flight finishes. The seed is ``finished`` once nothing of it is left. A
  resume lifts the mark (a scheduled seed's next run would be cancelled too while it lasts).

Each action is recorded (``<ns>:seeds:controls``: who, when, what), appended to the
namespace's event stream (``seed paused``, ``seed resumed``, ``seed cancelled``) and logged.
The functions take a blocking client (the CLI's, the API's).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.consume.delayed_set import wake_parked
from meteorseed_scrapy.queue.consume.task_history import HistoryEntry, TaskHistory
from meteorseed_scrapy.queue.enqueue.dedup import fingerprint_bytes
from meteorseed_scrapy.queue.fleet import events
from meteorseed_scrapy.queue.fleet.crawl_progress import events_key, finish_if_done_sync
from meteorseed_scrapy.queue.fleet.spiders import with_registered_sync
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.replies import record_of, text_of
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.task.json_depth import loads_bounded
from meteorseed_scrapy.task.validation import TaskError, check_id

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis

logger = logging.getLogger(__name__)

#: A worker reads the held and cancelled seeds this often (seconds): a hold takes effect on
#: every worker within this (tasks started before it finish).
POLL_S = 0.25
#: How long a cancel's mark lasts (seconds): a task of the seed read later is settled as
#: cancelled without a fetch (one that comes out of a stream after that is crawled).
CANCEL_RETENTION_S = 7 * 86400
#: A held seed's tasks are parked this long (seconds; made due at once on resume).
PARK_S = 3600.0
#: Stream entries or delayed-set members looked at per cancel script call (its bound), and
#: members per page of a resume.
PAGE = 500





def checked(seed_id: str) -> str:
    """``seed_id`` as an id, else a ValueError naming ``seed_id``."""
    try:
        return check_id("seed_id", seed_id)
    except TaskError as exc:
        raise ValueError(str(exc)) from None


def _record(client: SyncRedis, keys: KeyLayout, seed_id: str, what: str, by: str,
            **fields: Any) -> dict[str, Any]:
    given = {k: v for k, v in fields.items() if v not in (None, "")}
    record = {"state": what, "by": by, "at": time.time(), **given}
    client.hset(keys.seed_controls, seed_id, json.dumps(record))
    events.append(client, keys.events, events.CrawlEvent(f"seed {what}"), seed=seed_id, by=by,
                  **given)
    logger.info("Seed %s %s by %s%s", seed_id, what, by,
                "".join(f"; {k} {v}" for k, v in given.items()))
    return record


def hold(client: SyncRedis, keys: KeyLayout, seed_id: str, by: str, reason: str = "") -> bool:
    """Hold the seed fleet-wide; False when it was held already (the first hold stays)."""
    seed_id = checked(seed_id)
    record = json.dumps({"by": by, "at": time.time(), "reason": reason})
    if not client.hsetnx(keys.seeds_held, seed_id, record):
        return False
    _record(client, keys, seed_id, "paused", by, reason=reason)
    return True


def _message(member: Any) -> str:
    """A delayed-set member's task JSON (after its route), or a stream message's ``t``."""
    text = text_of(member, "backslashreplace")
    return text if text.startswith("{") else text.partition("|")[2]


def _seed_of(message: str) -> str | None:
    try:
        data = loads_bounded("task", message)
    except ValueError:
        return None
    seed = data.get("seed_id") if isinstance(data, dict) else None
    return seed if isinstance(seed, str) else None


def release(client: SyncRedis, keys: KeyLayout, seed_id: str, by: str) -> int | None:
    """Resume a held seed: its parked tasks due now. How many were made due (None: it was
    neither held nor cancelled). A cancelled seed's mark is lifted: tasks of it enqueued from
    now on (a scheduled seed's next run) are crawled."""
    seed_id = checked(seed_id)
    lifted = client.zrem(keys.seeds_cancelled, seed_id)
    if not client.hdel(keys.seeds_held, seed_id) and not lifted:
        return None
    def parked_here(member: Any) -> bool:
        return _seed_of(_message(member)) == seed_id

    woken = wake_parked(client, keys, DeferReason.PAUSED, parked_here)
    _record(client, keys, seed_id, "resumed", by, woken=woken)
    return woken


def _needles(seed_id: str) -> list[str]:
    """``seed_id`` as a task's JSON holds it: a JSON string as the writers encode it (non-ASCII
    as is), and with non-ASCII escaped (another producer's ``json.dumps``)."""
    forms = []
    for form in (json.dumps(seed_id, ensure_ascii=False), json.dumps(seed_id)):
        try:
            form.encode("utf-8")
        except UnicodeEncodeError:  # (a lone surrogate: no task can hold it so)
            continue
        if form not in forms:
            forms.append(form)
    return forms


class Canceller:
    """One cancel's sweep, in Redis page by page (``lua/seed_cancel.lua``, modes ``dscan`` and
    ``scan``): the seed's delayed tasks, then its unread stream entries. A script call looks at
    :data:`PAGE` stream entries at most (about as many set members: ZSCAN's count is a hint)
    and decodes only those holding the seed's id: about 1 ms of Redis a call
    (``benchmarks/seed_cancel.py``), so a cancel never blocks it long. Each removal
    is counted by the call that makes it: nothing is counted twice, whoever else settles the
    seed's tasks meanwhile."""

    def __init__(self, client: SyncRedis, keys: KeyLayout, seed_id: str, progress_retention: int,
                 history: TaskHistory[SyncRedis] | None) -> None:
        self.client, self.seed_id = client, seed_id
        self.keys = with_registered_sync(client, keys)  # every spider's task set too
        self.retention = progress_retention
        self.history = history if history is not None and history.active else None
        self.script = scripts.register(client, "seed_cancel")
        self.needles = _needles(seed_id)
        self.zeroed: set[str] = set()
        self.removed: list[Any] = []  # (the task JSON of those removed, for the history)

    def _sweep(self, key: str, mode: str) -> int:
        n, cursor = 0, ""
        while True:
            settled, zeroed, cursor, texts = self.script(keys=[key], args=[
                mode, GROUP, "", events_key(self.keys), f"{time.time():.3f}", self.retention,
                self.seed_id, cursor, PAGE, *self.needles])
            n += int(settled)
            self.zeroed.update(text_of(s) for s in zeroed)
            if self.history is not None:
                self.removed += texts
                if len(self.removed) >= PAGE:
                    self.remember()
            cursor = text_of(cursor)
            if not cursor:
                return n

    def remember(self) -> None:
        """Record the tasks removed so far in the task history."""
        texts, self.removed = self.removed, []
        if self.history is None or not texts:
            return
        entries = []
        for text in texts:
            try:
                task = ExecTask.from_message({"v": MESSAGE_VERSION, "t": text})
                fp = fingerprint_bytes(task)
            except (TaskError, ValueError):  # (removed all the same: a worker would drop it)
                continue
            entries.append(HistoryEntry.of(task, fp, "cancelled", "", reason="seed cancelled"))
        self.history.write_sync(entries)

    def delayed(self) -> int:
        return sum(self._sweep(key, "dscan")
                   for shard in self.keys.shard_keys for key in shard.delayeds)

    def unread(self) -> int:
        return sum(self._sweep(stream, "scan")
                   for shard in self.keys.shard_keys for stream in shard.streams)


def cancel(client: SyncRedis, keys: KeyLayout, seed_id: str, by: str, *,
           progress_retention: int = DEFAULTS["METEORSEED_SEED_PROGRESS_RETENTION"],
           history: TaskHistory[SyncRedis] | None = None,
           retention_s: float = CANCEL_RETENTION_S) -> dict[str, int]:
    """Cancel the seed fleet-wide; what was removed (``delayed``, ``waiting``). ``history``:
    where the removed tasks' ends are recorded (default: the default retention and bound)."""
    seed_id = checked(seed_id)
    if history is None:
        history = TaskHistory(client, keys, DEFAULTS["METEORSEED_TASK_HISTORY_RETENTION"],
                              DEFAULTS["METEORSEED_TASK_HISTORY_PER_SITE"])
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    lapsed = [text_of(s) for s in client.zrangebyscore(keys.seeds_cancelled, "-inf", now_ms)]
    if lapsed:  # (their records go with their marks: the set stays bounded)
        client.zrem(keys.seeds_cancelled, *lapsed)
        client.hdel(keys.seed_controls, *lapsed)
    client.zadd(keys.seeds_cancelled, {seed_id: now_ms + int(retention_s * 1000)})
    client.hdel(keys.seeds_held, seed_id)  # (its parked tasks are removed below)
    sweep = Canceller(client, keys, seed_id, progress_retention, history)
    removed = {"delayed": sweep.delayed(), "waiting": sweep.unread()}
    sweep.remember()
    if sweep.zeroed and keys.tagged:
        finish_if_done_sync(client, keys, sorted(sweep.zeroed), progress_retention)
    _record(client, keys, seed_id, "cancelled", by, **removed)
    return removed


def control_of(client: SyncRedis, keys: KeyLayout, seed_id: str) -> dict[str, Any] | None:
    """The seed's last control and whether it is held or cancelled now; None: never
    controlled."""
    held = client.hexists(keys.seeds_held, seed_id)
    lapses = client.zscore(keys.seeds_cancelled, seed_id)
    raw = client.hget(keys.seed_controls, seed_id)
    if raw is None and not held and lapses is None:
        return None
    record = record_of(raw) if raw is not None else {}
    return {**record, "held": bool(held),
            "cancelled": lapses is not None and lapses > time.time() * 1000}


def shown_state(progress_state: str, control: dict[str, Any] | None) -> str:
    """A seed's state as ``seeds list``/``show``, ``GET /seeds`` and the console show it:
    ``cancelled`` while its cancel's mark lasts, ``paused`` while it is held, else its
    progress' state (``control``: :func:`control_of`'s or a :func:`controls` value)."""
    if control is not None and control.get("cancelled"):
        return "cancelled"
    if control is not None and control.get("held"):
        return "paused"
    return progress_state


def controls(client: SyncRedis, keys: KeyLayout) -> dict[str, dict[str, Any]]:
    """Per seed: its last control (``state`` paused|resumed|cancelled, who, when) and
    whether it is ``held`` or ``cancelled`` now."""
    held = {text_of(s) for s in client.hkeys(keys.seeds_held)}
    cancelled = {text_of(s) for s in client.zrangebyscore(keys.seeds_cancelled, "(" + str(
        int(time.time() * 1000)), "+inf")}
    out: dict[str, dict[str, Any]] = {}
    for seed, raw in client.hgetall(keys.seed_controls).items():
        out[text_of(seed)] = record_of(raw)
    for seed in held | cancelled | set(out):
        out.setdefault(seed, {}).update(held=seed in held, cancelled=seed in cancelled)
    return out


__all__ = ["CANCEL_RETENTION_S", "PARK_S", "POLL_S", "cancel",
           "checked", "control_of", "controls", "hold", "release", "shown_state"]

"""Reading, requeueing and purging the dead-letter stream ``<ns>:dead`` (on a Redis Cluster with
``METEORSEED_STREAM_SHARDS`` > 1 one per shard, ``<ns>:{s<k>}:dead``: a dead letter's id is then
``<k>:<stream id>``, and listings go shard by shard, each oldest first).

A dead letter (written by ``lua/dead.lua``) has the fields ``t`` (the original task JSON, or
the raw message fields as JSON when the message could not be decoded), ``reason``,
``source_id``, ``consumer``, ``deliveries`` and ``at``. Only one whose ``t`` is a valid exec
task can be requeued; a malformed one stays until it is purged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

import redis

from meteorseed_scrapy.queue.enqueue.dedup import Fingerprinter, fingerprint_bytes
from meteorseed_scrapy.queue.fleet.crawl_progress import events_key, tell_started_sync
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.task.exec_task import MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.task.json_depth import loads_bounded, top_level_strings
from meteorseed_scrapy.task.validation import TaskError, check_id

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis

#: Dead letters per XRANGE page and per requeue script call (one call blocks Redis briefly).
BATCH = 200

#: XRANGE's reply with ``decode_responses=True`` (redis-py's own annotation also allows bytes).
_Entries = list[tuple[str, dict[str, str]]]


#: A dead letter's id: its stream id, after ``<shard>:`` when each shard has its own.
LETTER_ID = re.compile(r"^(\d+:)?\d+-\d+$")
#: What an invalid id is told it should look like.
LETTER_ID_FORM = "<ms>-<seq>, with stream shards on a cluster <shard>:<ms>-<seq>"

#: Newest dead-letter id per shard, what ``--all`` acts on (see :func:`last_id`).
Upto = dict[int, str]


def letter_id(keys: KeyLayout, shard: int, entry_id: str) -> str:
    """A dead letter's id as the CLI and the API show it."""
    return f"{shard}:{entry_id}" if len(keys.deads) > 1 else entry_id


def split_id(keys: KeyLayout, letter: str) -> tuple[int, str] | None:
    """``(shard, stream id)`` of a dead letter's id; None when it names no shard there is."""
    shard, sep, entry_id = letter.rpartition(":")
    if len(keys.deads) == 1:
        return (0, letter) if not sep else None
    if not sep or not shard.isdigit() or int(shard) >= len(keys.deads):
        return None
    return int(shard), entry_id


@dataclass(frozen=True)
class DeadLetter:
    id: str
    fields: dict[str, str]
    task: ExecTask | None = None
    error: str = ""
    site_id: str | None = None
    shard: int = 0  # its dead-letter stream (index into KeyLayout.deads)
    entry_id: str = ""  # the id in that stream

    @classmethod
    def decode(cls, entry_id: str, fields: dict[str, str], keys: KeyLayout | None = None,
               shard: int = 0) -> DeadLetter:
        raw = fields.get("t", "")
        shown = letter_id(keys, shard, entry_id) if keys is not None else entry_id
        try:
            task = ExecTask.from_message({"v": MESSAGE_VERSION, "t": raw})
        except TaskError as exc:
            problem = _message_problem(raw) or str(exc)
            return cls(shown, fields, None, f"not a valid task ({problem})", _loose_site(raw),
                       shard, entry_id)
        return cls(shown, fields, task, "", task.site_id, shard, entry_id)

    def summary(self) -> dict[str, Any]:
        """The JSON shape of ``dead list`` and ``dead show``."""
        at = self.fields.get("at")
        return {
            "id": self.id,
            "site_id": self.site_id,
            "task_id": self.task.task_id if self.task else None,
            "seed_id": self.task.seed_id if self.task else None,
            "url": self.task.url if self.task else None,
            "spider": self.task.spider if self.task else None,  # (its set, when requeued)
            "reason": self.fields.get("reason", ""),
            "source_id": self.fields.get("source_id"),
            "consumer": self.fields.get("consumer"),
            "deliveries": _int(self.fields.get("deliveries")),
            "at": _iso(at),
            "requeueable": self.task is not None,
            "error": self.error or None,
        }


def _message_problem(raw: str) -> str | None:
    """What is wrong with a malformed message dead-lettered as it came (its fields as a JSON
    object, not a task): read as a task, every one of them would be "task_id: is missing"."""
    try:
        data = loads_bounded("message", raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or "task_id" in data:
        return None
    try:
        ExecTask.from_message(data)
    except TaskError as exc:
        return f"a malformed message: {exc}"
    except Exception:  # a shape from_message does not take (nested values): the task error
        return None
    return None


def _loose_site(raw: str) -> str | None:
    """The site a payload that is not a valid task names at its top level, however deep it
    nests; for a malformed message kept as its fields (no task_id, no site_id, one t), the
    site its task names. None for none, for two that differ (which one counts would depend on
    the reader), and for a value that is no task's site id."""
    found = top_level_strings(raw, ("site_id", "task_id", "t"))
    tasks = set(found.get("t", ()))
    if "site_id" not in found and "task_id" not in found and len(tasks) == 1:
        found = top_level_strings(tasks.pop() or "", ("site_id",))
    sites = set(found.get("site_id", ()))
    site = sites.pop() if len(sites) == 1 else None
    try:
        check_id("site_id", site).encode("utf-8")  # (a lone surrogate does not: no task's)
    except ValueError:
        return None
    return site


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _iso(value: str | None) -> str | None:
    try:
        stamp = float(value) if value is not None else None
    except ValueError:
        return value
    if stamp is None:
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds")


def iter_dead(client: SyncRedis, keys: KeyLayout, upto: Upto | None = None,
              site: str | None = None) -> Iterator[DeadLetter]:
    """Every dead letter (shard by shard, each oldest first), up to the ids of ``upto`` when
    given (a shard it does not name is skipped), optionally of one site only."""
    for k, dead in enumerate(keys.deads):
        end = "+" if upto is None else upto.get(k)
        if end is None:
            continue
        start = "-"
        while True:
            page = cast(_Entries, client.xrange(dead, start, end, count=BATCH))
            for entry_id, fields in page:
                letter = DeadLetter.decode(entry_id, fields, keys, k)
                if site is None or letter.site_id == site:
                    yield letter
            if len(page) < BATCH:
                break
            start = "(" + page[-1][0]


def fetch(client: SyncRedis, keys: KeyLayout, ids: Sequence[str]
          ) -> tuple[list[DeadLetter], list[str]]:
    """The dead letters with ``ids`` and the ids that are not (or no longer) there."""
    pipe = client.pipeline(transaction=False)
    asked: list[tuple[str, int]] = []
    missing: list[str] = []
    for letter in ids:
        where = split_id(keys, letter)
        if where is None:
            missing.append(letter)
            continue
        pipe.xrange(keys.deads[where[0]], where[1], where[1])
        asked.append((letter, where[0]))
    found: list[DeadLetter] = []
    replies = pipe.execute(raise_on_error=False) if asked else []
    for (letter, k), reply in zip(asked, replies, strict=True):
        if isinstance(reply, redis.ResponseError):  # "Invalid stream ID"
            missing.append(letter)
        elif isinstance(reply, Exception):
            raise reply
        elif reply:
            entry_id, fields = reply[0]
            found.append(DeadLetter.decode(entry_id, fields, keys, k))
        else:
            missing.append(letter)
    return found, missing


@dataclass
class RequeueResult:
    requeued: list[dict[str, str]] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def requeue(client: SyncRedis, keys: KeyLayout, letters: Sequence[DeadLetter],
            result: RequeueResult | None = None, *,
            fingerprinter: Fingerprinter | None = None) -> RequeueResult:
    """Requeue ``letters`` (one atomic script call per :data:`BATCH`). ``fingerprinter``: the
    project's (``cli.common.project_fingerprinter``), so that the URL recorded in its site's
    dedup set is the key the project's workers and seeders look up; None: canonical URLs."""
    result = result or RequeueResult()
    script = scripts.register(client, "requeue")
    valid: list[tuple[DeadLetter, ExecTask]] = []
    for letter in letters:
        if letter.task is None:
            result.kept.append({"id": letter.id, "error": letter.error})
        else:
            valid.append((letter, letter.task))
    spiders = {task.spider for _, task in valid if task.spider is not None}
    if spiders:  # (listed before written, as every writer does)
        client.sadd(keys.spiders_key, *sorted(spiders))
    by_shard: dict[int, list[tuple[DeadLetter, ExecTask]]] = {}
    for letter, task in valid:
        by_shard.setdefault(letter.shard, []).append((letter, task))
    for k, letters_k in by_shard.items():
        for i in range(0, len(letters_k), BATCH):
            chunk = letters_k[i:i + BATCH]
            script_keys = [keys.deads[k]]
            args: list[str] = [MESSAGE_VERSION]
            for letter, task in chunk:
                # Back to the task's own lane (and the band of its priority), in its site's
                # shard; on a cluster in the shard of its dead letter (one slot per call),
                # which is the same unless it was put in another shard's stream.
                shard = keys.shard_keys[k] if len(keys.deads) > 1 else keys.for_site(
                    task.site_id)
                script_keys += [shard.stream_for(task.lane, task.priority, task.spider),
                                shard.done(task.task_id), shard.failed(task.task_id),
                                shard.seen(task.site_id)]
                try:  # (a site of another shard: its dedup root is elsewhere, left alone)
                    fp = (fingerprint_bytes(task, fingerprinter=fingerprinter).hex()
                          if keys.for_site(task.site_id) == shard else "")
                except ValueError:  # the project's fingerprinter failed: keep dedup untouched
                    fp = ""
                args += [letter.entry_id or letter.id, letter.fields["t"], fp]
            done = dict(script(keys=[*script_keys, *filter(None, [events_key(keys)])],
                               args=args))
            for letter, task in chunk:
                new_id = done.get(letter.entry_id or letter.id)
                if new_id is not None:
                    result.requeued.append({"id": letter.id, "task_id": task.task_id,
                                            "stream_id": new_id})
                else:
                    result.missing.append(letter.id)
    # (a sharded layout's scripts tell no event: a seed run again by its requeue starts here)
    tell_started_sync(client, keys, {t.seed_id for _l, t in valid},
                      DEFAULTS["METEORSEED_SEED_PROGRESS_RETENTION"])
    return result


def purge(client: SyncRedis, keys: KeyLayout, ids: Sequence[str]) -> int:
    """Delete the dead letters ``ids``; returns how many existed."""
    deleted = 0
    by_shard: dict[int, list[str]] = {}
    for letter in ids:
        where = split_id(keys, letter)
        if where is not None:
            by_shard.setdefault(where[0], []).append(where[1])
    for k, entry_ids in by_shard.items():
        for i in range(0, len(entry_ids), BATCH):
            deleted += int(client.xdel(keys.deads[k], *entry_ids[i:i + BATCH]))
    return deleted


def purge_older(client: SyncRedis, keys: KeyLayout, seconds: float) -> int:
    """Delete every dead letter older than ``seconds`` (by Redis's clock: the ids are its
    millisecond times); returns how many went."""
    secs, _ = client.time()
    min_id = max(0, int((secs - seconds) * 1000))
    return sum(int(client.xtrim(dead, minid=min_id, approximate=False)) for dead in keys.deads)


def last_id(client: SyncRedis, keys: KeyLayout) -> Upto:
    """The newest dead letter's id per dead-letter stream (empty ones left out): ``--all`` acts on
    what existed when it was confirmed."""
    out: Upto = {}
    for k, dead in enumerate(keys.deads):
        newest = cast(_Entries, client.xrevrange(dead, "+", "-", count=1))
        if newest:
            out[k] = newest[0][0]
    return out

"""Reading, requeueing and purging the dead-letter stream ``<ns>:dead``.

A dead letter (written by ``lua/dead.lua``) has the fields ``t`` (the original task JSON, or
the raw message fields as JSON when the message could not be decoded), ``reason``,
``source_id``, ``consumer``, ``deliveries`` and ``at``. Only one whose ``t`` is a valid exec
task can be requeued; a malformed one stays until it is purged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

import redis

from meteorseed_scrapy import scripts
from meteorseed_scrapy.keys import KeyLayout
from meteorseed_scrapy.streams.writer import fingerprint
from meteorseed_scrapy.tasks import MESSAGE_VERSION, ExecTask, TaskError

#: Dead letters per XRANGE page and per requeue script call (one call blocks Redis briefly).
BATCH = 200

#: XRANGE's reply with ``decode_responses=True`` (redis-py's own annotation also allows bytes).
_Entries = list[tuple[str, dict[str, str]]]


@dataclass(frozen=True)
class DeadLetter:
    id: str
    fields: dict[str, str]
    task: ExecTask | None = None
    error: str = ""
    site_id: str | None = None

    @classmethod
    def decode(cls, entry_id: str, fields: dict[str, str]) -> DeadLetter:
        raw = fields.get("t", "")
        try:
            task = ExecTask.from_message({"v": MESSAGE_VERSION, "t": raw})
        except TaskError as exc:
            return cls(entry_id, fields, None, f"not a valid task ({exc})", _loose_site(raw))
        return cls(entry_id, fields, task, "", task.site_id)

    def summary(self) -> dict[str, Any]:
        """The JSON shape of ``dead list`` and ``dead show``."""
        at = self.fields.get("at")
        return {
            "id": self.id,
            "site_id": self.site_id,
            "task_id": self.task.task_id if self.task else None,
            "seed_id": self.task.seed_id if self.task else None,
            "url": self.task.url if self.task else None,
            "reason": self.fields.get("reason", ""),
            "source_id": self.fields.get("source_id"),
            "consumer": self.fields.get("consumer"),
            "deliveries": _int(self.fields.get("deliveries")),
            "at": _iso(at),
            "requeueable": self.task is not None,
            "error": self.error or None,
        }


def _loose_site(raw: str) -> str | None:
    """The site of a payload that is not a valid task, when it still names one."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    site = data.get("site_id") if isinstance(data, dict) else None
    return site if isinstance(site, str) else None


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


def iter_dead(client: redis.Redis, keys: KeyLayout, upto: str = "+",
              site: str | None = None) -> Iterator[DeadLetter]:
    """Every dead letter (oldest first) up to id ``upto``, optionally of one site only."""
    start = "-"
    while True:
        page = cast(_Entries, client.xrange(keys.dead, start, upto, count=BATCH))
        for entry_id, fields in page:
            letter = DeadLetter.decode(entry_id, fields)
            if site is None or letter.site_id == site:
                yield letter
        if len(page) < BATCH:
            return
        start = "(" + page[-1][0]


def fetch(client: redis.Redis, keys: KeyLayout, ids: Sequence[str]
          ) -> tuple[list[DeadLetter], list[str]]:
    """The dead letters with ``ids`` and the ids that are not (or no longer) there."""
    pipe = client.pipeline(transaction=False)
    for entry_id in ids:
        pipe.xrange(keys.dead, entry_id, entry_id)
    found: list[DeadLetter] = []
    missing: list[str] = []
    replies = pipe.execute(raise_on_error=False) if ids else []
    for entry_id, reply in zip(ids, replies, strict=True):
        if isinstance(reply, redis.ResponseError):  # "Invalid stream ID"
            missing.append(entry_id)
        elif isinstance(reply, Exception):
            raise reply
        elif reply:
            found.append(DeadLetter.decode(*reply[0]))
        else:
            missing.append(entry_id)
    return found, missing


@dataclass
class RequeueResult:
    requeued: list[dict[str, str]] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def requeue(client: redis.Redis, keys: KeyLayout, letters: Sequence[DeadLetter],
            result: RequeueResult | None = None) -> RequeueResult:
    """Requeue ``letters`` (one atomic script call per :data:`BATCH`)."""
    result = result or RequeueResult()
    script = scripts.register(client, "requeue")
    valid: list[tuple[DeadLetter, ExecTask]] = []
    for letter in letters:
        if letter.task is None:
            result.kept.append({"id": letter.id, "error": letter.error})
        else:
            valid.append((letter, letter.task))
    for i in range(0, len(valid), BATCH):
        chunk = valid[i:i + BATCH]
        script_keys = [keys.dead]
        args: list[str] = [MESSAGE_VERSION]
        for letter, task in chunk:
            # Back to the task's own lane (and the band of its priority).
            script_keys += [keys.stream_for(task.lane, task.priority), keys.done(task.task_id),
                            keys.failed(task.task_id), keys.seen(task.site_id)]
            try:
                fp = fingerprint(task)
            except ValueError:  # unreachable for a task that decoded; keep dedup untouched
                fp = ""
            args += [letter.id, letter.fields["t"], fp]
        done = {dead_id: new_id for dead_id, new_id in script(keys=script_keys, args=args)}
        for letter, task in chunk:
            if letter.id in done:
                result.requeued.append({"id": letter.id, "task_id": task.task_id,
                                        "stream_id": done[letter.id]})
            else:
                result.missing.append(letter.id)
    return result


def purge(client: redis.Redis, keys: KeyLayout, ids: Sequence[str]) -> int:
    """Delete the dead letters ``ids``; returns how many existed."""
    deleted = 0
    for i in range(0, len(ids), BATCH):
        deleted += int(client.xdel(keys.dead, *ids[i:i + BATCH]))
    return deleted


def purge_older(client: redis.Redis, keys: KeyLayout, seconds: float) -> int:
    """Delete every dead letter older than ``seconds`` (by Redis's clock: the ids are its
    millisecond times); returns how many went."""
    secs, _ = client.time()
    min_id = max(0, int((secs - seconds) * 1000))
    return int(client.xtrim(keys.dead, minid=min_id, approximate=False))


def last_id(client: redis.Redis, keys: KeyLayout) -> str | None:
    """The newest dead letter's id: ``--all`` acts on what existed when it was confirmed."""
    newest = cast(_Entries, client.xrevrange(keys.dead, "+", "-", count=1))
    return newest[0][0] if newest else None

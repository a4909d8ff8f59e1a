"""A task lookup's query and answer (:mod:`meteorseed_scrapy.queue.inspect.task_state` reads it).

A query is a task id, or a URL canonicalised and fingerprinted as the writer does it for a plain
GET (:func:`~meteorseed_scrapy.queue.enqueue.dedup.fingerprint_bytes`); anything else is refused
with a
:class:`TaskError` naming the argument, whatever the input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from meteorseed_scrapy.queue.consume.task_history import CODES
from meteorseed_scrapy.queue.enqueue.dedup import Fingerprinter, fingerprint_bytes
from meteorseed_scrapy.task.canonical import canonical_url
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError, check_id, check_url


class Place(str, Enum):
    """Where a task is found: a place's ``state`` (``meteorseed task``, ``GET /tasks``); in
    the order in which one state sums up a task found in several places (a URL enqueued again
    after its window, a done record beside a redelivery). Its str() is its value, as
    :class:`~meteorseed_scrapy.task.exceptions.DeferReason`'s."""

    __str__ = str.__str__

    PENDING = "pending"
    WAITING = "waiting"
    DELAYED = "delayed"
    DEAD = "dead"
    DONE = "done"


#: What a URL's task history record may say (queue/consume/task_history.py), when no place has it.
ENDS = tuple(CODES)


@dataclass(frozen=True)
class TaskQuery:
    """What is looked up: a task id, or a URL with its canonical form and dedup fingerprint."""

    task_id: str | None = None
    url: str | None = None
    canonical: str | None = None
    fingerprint: bytes = b""
    site_id: str | None = None
    #: The project's REQUEST_FINGERPRINTER_CLASS when the writer uses it (queue/enqueue/dedup.py).
    fingerprinter: Fingerprinter | None = field(default=None, compare=False, repr=False)

    def fingerprint_of(self, task: ExecTask) -> bytes:
        """``task``'s dedup fingerprint as the writer computes it (ValueError if it cannot)."""
        return fingerprint_bytes(task, fingerprinter=self.fingerprinter)

    def matches(self, task: ExecTask) -> bool:
        if self.task_id is not None:
            return task.task_id == self.task_id
        try:
            return self.fingerprint_of(task) == self.fingerprint
        except ValueError:
            return False

    def to_json(self) -> dict[str, Any]:
        keys = "REQUEST_FINGERPRINTER_CLASS" if self.fingerprinter else "canonical URL"
        if self.task_id is not None:
            return {"task_id": self.task_id, "site_id": self.site_id, "dedup_keys": keys}
        return {"url": self.url, "canonical_url": self.canonical,
                "fingerprint": self.fingerprint.hex(), "site_id": self.site_id,
                "dedup_keys": keys}


def _text_arg(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TaskError(name, "must be a task id or an http(s) URL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise TaskError(name, "is not valid UTF-8 text") from None
    return value


def query_for_id(value: Any, name: str = "id", site: str | None = None,
                 fingerprinter: Fingerprinter | None = None) -> TaskQuery:
    """A task-id query; :class:`TaskError` naming ``name`` (or ``site_id``) when invalid."""
    try:
        task_id = check_id(name, _text_arg(name, value))
    except TaskError as exc:
        raise TaskError(name, exc.problem) from None
    return TaskQuery(task_id=task_id, site_id=_site(site), fingerprinter=fingerprinter)


def query_for_url(value: Any, name: str = "url", site: str | None = None,
                  fingerprinter: Fingerprinter | None = None) -> TaskQuery:
    """A URL query, canonicalised and fingerprinted as the writer does for a plain GET (with
    the project's ``fingerprinter`` when the writer uses one)."""
    url = check_url(_text_arg(name, value), name)
    try:
        canonical = canonical_url(url)
        task = ExecTask(task_id="lookup", seed_id="lookup", site_id="lookup", url=url)
        fp = fingerprint_bytes(task, canonical, fingerprinter)
    except ValueError as exc:
        raise TaskError(name, f"cannot be canonicalised or fingerprinted ({exc})"[:300]
                        ) from None
    return TaskQuery(url=url, canonical=canonical, fingerprint=fp, site_id=_site(site),
                     fingerprinter=fingerprinter)


def parse_query(value: Any, name: str = "URL|ID", site: str | None = None,
                fingerprinter: Fingerprinter | None = None) -> TaskQuery:
    """A URL (it has ``://``) or else a task id."""
    text = _text_arg(name, value)
    if "://" in text:
        return query_for_url(text, name, site, fingerprinter)
    return query_for_id(text, name, site, fingerprinter)


def _site(site: str | None) -> str | None:
    return None if site is None else check_id("site_id", site)


@dataclass
class Search:
    where: str
    how: str
    read: int
    complete: bool

    def to_json(self) -> dict[str, Any]:
        return {"where": self.where, "how": self.how, "read": self.read,
                "complete": self.complete}


@dataclass
class TaskState:
    """The answer: ``state`` sums up ``places`` (each a state with where and since when),
    ``dedup`` is the URL's dedup record, ``searched`` what was read and whether fully."""

    query: TaskQuery
    at: float
    places: list[dict[str, Any]] = field(default_factory=list)
    dedup: list[dict[str, Any]] = field(default_factory=list)
    #: The URL's task history records (one per site that has one), newest first.
    history: list[dict[str, Any]] = field(default_factory=list)
    last_failure: str | None = None
    searched: list[Search] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add_place(self, place: dict[str, Any]) -> int:
        """The task is found at ``place`` (its ``state`` and where); returns the place's
        number for :meth:`record_delivery` and :meth:`record_acked`."""
        self.places.append(place)
        return len(self.places) - 1

    def record_delivery(self, number: int, consumer: str, idle_s: float,
                        deliveries: int) -> None:
        """Pending place ``number`` is delivered to ``consumer``, idle ``idle_s``, delivered
        ``deliveries`` times (its XPENDING row)."""
        self.places[number].update(consumer=consumer, idle_s=idle_s, deliveries=deliveries)

    def record_acked(self, number: int) -> None:
        """Pending place ``number`` was acked between the two reads: it is done."""
        self.places[number].update(state=Place.DONE.value, note="acked while being looked up")

    def add_dedup(self, row: dict[str, Any]) -> None:
        """The dedup record of the URL under one site."""
        self.dedup.append(row)

    def add_history(self, row: dict[str, Any]) -> None:
        """What became of the URL when a task of it last ended (its site's task history)."""
        self.history.append(row)
        self.history.sort(key=lambda r: -r["at"])

    def record_failure(self, note: str) -> None:
        """The task's last failure note (the last shard read wins)."""
        self.last_failure = note

    def record_search(self, search: Search) -> None:
        """One key read, how much of it and whether fully."""
        self.searched.append(search)

    def add_note(self, note: str) -> None:
        self.notes.append(note)

    @property
    def state(self) -> str:
        found = {place["state"] for place in self.places}
        for place in Place:
            if place.value in found:
                return place.value
        if self.history:
            return str(self.history[0]["outcome"])
        if any(d["seen"] for d in self.dedup):
            return "deduplicated"
        return "not found"

    @property
    def exhaustive(self) -> bool:
        return all(s.complete for s in self.searched)

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query.to_json(), "state": self.state, "at": self.at,
                "places": self.places, "dedup": self.dedup, "history": self.history,
                "last_failure": self.last_failure,
                "searched": [s.to_json() for s in self.searched],
                "exhaustive": self.exhaustive, "notes": self.notes}


__all__ = ["ENDS", "Place", "Search", "TaskQuery", "TaskState", "parse_query", "query_for_id",
           "query_for_url"]

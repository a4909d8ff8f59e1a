"""The book of a worker's tasks: their deliveries, what happened to each, its children still
on their way to the stream. It only counts; :mod:`.fate` decides when a task is settled.

A task may be acked only when (a) its request's final hop was processed, (b) every item it
produced was committed by the store stage, and (c) every request its callback yielded is durable
in the stream. (b) holds once the scrape finished, because the store stage awaits its commit
before an item passes; failures along the way are recorded on the :class:`Scrape`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

from meteorseed_scrapy.queue.consume.delivery import Delivery, Ref
from meteorseed_scrapy.queue.fleet.crawl_progress import Settle
from meteorseed_scrapy.task.context import Scrape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.fate import Outcome, Verdict, WhatHappened


@dataclass(eq=False)
class Entry:
    task: ExecTask
    deliveries: list[Delivery]
    started: bool = False  # handed to the engine
    scrape: Scrape | None = None
    response_at: float = 0.0  # when the final hop's response reached the scraper
    happened: WhatHappened | None = None  # set once the final hop was processed
    verdict: Verdict | None = None  # set when it settles (:func:`.fate.fate`)
    children_pending: int = 0
    children: int = 0  # requests its final hop's callback (or errback) yielded

    @property
    def outcome(self) -> Outcome | None:
        return self.verdict.outcome if self.verdict is not None else None

    @property
    def reason(self) -> str:
        return self.verdict.reason if self.verdict is not None else ""

    @property
    def refs(self) -> list[Ref]:
        """Its messages as ``(stream, id)``: each delivery knows the stream (lane) it came from."""
        return [d.ref for d in self.deliveries]

    def settle(self) -> Settle:
        """What its ack counts for in its seed's progress: the items its scrape committed, the
        anomalies it kept, the bytes of its final response."""
        scrape = self.scrape
        if scrape is None:
            return Settle(self.task.seed_id, self.task.site_id)
        return Settle(self.task.seed_id, self.task.site_id, scrape.committed, scrape.anomalies,
                      scrape.bytes)

    def record(self) -> str:
        """The completion record stored in Redis when the task is acked."""
        scrape = self.scrape
        record: dict[str, object] = {
            "outcome": self.outcome.value if self.outcome else None,
            "items": scrape.committed if scrape else 0,
            "digest": scrape.digest if scrape else "",
            "status": self.verdict.status if self.verdict is not None else 0,
            "at": round(time.time(), 3),
        }
        if self.reason:
            record["reason"] = self.reason[:2000]
        if scrape is not None and scrape.children_dropped:
            record["anomalies"] = [f"children over cap: {scrape.children_dropped} yielded"
                                   " requests dropped (METEORSEED_MAX_CHILDREN_PER_TASK)"]
        return json.dumps(record, separators=(",", ":"))


class TaskLedger:
    """In-memory book of this worker's tasks, keyed by ``task_id``."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._entries

    def get(self, task_id: str) -> Entry | None:
        return self._entries.get(task_id)

    def entries(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def refs(self) -> list[Ref]:
        return [r for e in self._entries.values() for r in e.refs]

    def add(self, delivery: Delivery) -> Entry | None:
        """Book a delivery; returns None when the task is already held (the entry absorbs it)."""
        assert delivery.task is not None
        existing = self._entries.get(delivery.task.task_id)
        if existing is not None:
            existing.deliveries.append(delivery)
            return None
        entry = Entry(delivery.task, [delivery])
        self._entries[delivery.task.task_id] = entry
        return entry

    def finish_scrape(self, task_id: str, happened: WhatHappened) -> Entry | None:
        """The final hop was processed: its facts are recorded, once. Returns the entry (None:
        not held, or already finished)."""
        entry = self._entries.get(task_id)
        if entry is None or entry.happened is not None:
            return None
        entry.happened = happened
        return entry

    def child_added(self, task_id: str) -> None:
        entry = self._entries.get(task_id)
        if entry is not None:
            entry.children_pending += 1
            entry.children += 1

    def child_durable(self, task_id: str) -> Entry | None:
        entry = self._entries.get(task_id)
        if entry is not None:
            entry.children_pending -= 1
        return entry

    def pop(self, task_id: str) -> Entry | None:
        return self._entries.pop(task_id, None)

    def forget_msg(self, ref: Ref) -> None:
        """Drop a delivery another worker took over (its entry goes when it has none left)."""
        for task_id, entry in list(self._entries.items()):
            entry.deliveries = [d for d in entry.deliveries if d.ref != ref]
            if not entry.deliveries and not entry.started:
                del self._entries[task_id]

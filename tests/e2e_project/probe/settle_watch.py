"""Test aid: when a task settles, relative to Scrapy's end of its items.

With ``SETTLE_WATCH_FILE`` set, every ``item_scraped`` handler call of a task that has not
settled yet holds Scrapy's processing of that item (it returns a Deferred) until the task
settles, or ``SETTLE_WATCH_HOLD`` seconds pass (a fallback: a worker that settles only after
Scrapy is done with the item would otherwise wait forever). At each settle it records how
many of the task's documents the store held. The JSON written at the end::

    {"released": {"settle": n, "timeout": n, "after": n}, "settles": {task_id: [outcome, stored]}}

("after": calls made once their task had settled, not held.)
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from scrapy import signals
from twisted.internet.defer import Deferred

from meteorseed_scrapy.task.context import task_of
from meteorseed_scrapy.worker.signals import task_settled


class SettleWatch:
    def __init__(self, crawler: Any) -> None:
        settings = crawler.settings
        self.path = settings.get("SETTLE_WATCH_FILE")
        self.hold = settings.getfloat("SETTLE_WATCH_HOLD", 10.0)
        self.store = str(settings.get("METEORSEED_STORE_URI", "")).removeprefix("sqlite:///")
        self.held: dict[str, list[tuple[Deferred[None], Any]]] = {}
        self.settled: dict[str, tuple[str, int]] = {}
        self.released = {"settle": 0, "timeout": 0, "after": 0}

    @classmethod
    def from_crawler(cls, crawler: Any) -> SettleWatch:
        watch = cls(crawler)
        if watch.path:
            crawler.signals.connect(watch.item_scraped, signals.item_scraped)
            crawler.signals.connect(watch.task_settled, task_settled)
            crawler.signals.connect(watch.closed, signals.engine_stopped)
        return watch

    def item_scraped(self, item: Any, response: Any, spider: Any) -> Deferred[None] | None:
        task = task_of(response)
        if task is None:
            return None
        if task.task_id in self.settled:
            self.released["after"] += 1
            return None
        held: Deferred[None] = Deferred()
        from twisted.internet import reactor  # (here: importing it installs a reactor)

        timer = reactor.callLater(self.hold, self._release, task.task_id, "timeout")  # type: ignore[attr-defined]
        self.held.setdefault(task.task_id, []).append((held, timer))
        return held

    def task_settled(self, task: Any, outcome: Any, reason: str) -> None:
        with sqlite3.connect(self.store) as conn:  # (blocking: a test aid)
            stored = conn.execute(
                "SELECT COUNT(*) FROM items WHERE json_extract(doc, '$.task_id') = ?",
                (task.task_id,)).fetchone()[0]
        self.settled[task.task_id] = (getattr(outcome, "value", str(outcome)), stored)
        self._release(task.task_id, "settle")

    def _release(self, task_id: str, why: str) -> None:
        for held, timer in self.held.pop(task_id, []):
            if timer.active():
                timer.cancel()
            self.released[why] += 1
            held.callback(None)

    def closed(self) -> None:
        with open(self.path, "w") as fh:
            json.dump({"released": self.released, "settles": self.settled}, fh)

"""Where a task's time goes from its response to its ack, step by step (``--stages``).

With ``BENCH_STAGES_FILE`` set, wraps (in this worker process only) the points a task passes:
its response reaching the scraper (``StreamPump.scrape_started``), its item reaching the store
stage (``GroupCommitter.submit``), the store thread's write
(``SQLiteStore.upsert_unconfirmed``), the commit heard on the event loop (the submit's
``on_commit``), the task settled
(``Completions.settled``), its completion pipeline sent and its reply read
(``Completions._complete``). At the end, the p50 / p95 of each step over the tasks that passed
them all (one item a task), as JSON. A measuring aid, not a test: it changes nothing else.
"""

from __future__ import annotations

import json
import statistics
import time
from functools import wraps
from itertools import pairwise
from typing import Any

from scrapy import signals

from meteorseed_scrapy.store.group_commit import GroupCommitter
from meteorseed_scrapy.store.sqlite import SQLiteStore
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.pump import StreamPump

STEPS = ("response", "to store", "write start", "write end", "committed", "settled", "sent",
         "acked")


class AckStages:
    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: dict[str, dict[str, float]] = {}

    @classmethod
    def from_crawler(cls, crawler: Any) -> AckStages | None:
        path = crawler.settings.get("BENCH_STAGES_FILE")
        ext = cls(path)
        if path:
            ext._wrap()
            crawler.signals.connect(ext.engine_stopped, signals.engine_stopped)
        return ext

    def stamp(self, task_id: Any, step: str) -> None:
        if task_id:  # (a dict's setdefault: safe from the store thread under the GIL)
            self.seen.setdefault(str(task_id), {}).setdefault(step, time.monotonic())

    def _wrap(self) -> None:
        stamp = self.stamp
        started = StreamPump.scrape_started
        submit = GroupCommitter.submit
        upsert = SQLiteStore.upsert_unconfirmed  # (the group committer's write)
        settled = Completions.settled
        complete = Completions._complete

        @wraps(started)
        def scrape_started(pump: Any, request: Any) -> Any:
            scrape = started(pump, request)
            if scrape is not None:
                stamp(scrape.task.task_id, "response")
            return scrape

        @wraps(submit)
        async def submit_(commits: Any, doc: dict[str, Any], on_commit: Any = None) -> Any:
            task_id = doc.get("task_id")
            stamp(task_id, "to store")

            def heard() -> None:
                stamp(task_id, "committed")
                if on_commit is not None:
                    on_commit()

            return await submit(commits, doc, heard)

        @wraps(upsert)
        def upsert_unconfirmed(store: Any, docs: list[dict[str, Any]]) -> None:
            for doc in docs:
                stamp(doc.get("task_id"), "write start")
            upsert(store, docs)
            for doc in docs:
                stamp(doc.get("task_id"), "write end")

        @wraps(settled)
        def settled_(comp: Any, entry: Any, *args: Any, **kwargs: Any) -> None:
            stamp(entry.task.task_id, "settled")
            settled(comp, entry, *args, **kwargs)

        @wraps(complete)
        async def complete_(comp: Any, batch: Any) -> None:
            tasks = [done.task for *_, done in batch if done is not None]
            for task in tasks:
                stamp(task.task_id, "sent")
            await complete(comp, batch)
            for task in tasks:
                stamp(task.task_id, "acked")

        StreamPump.scrape_started = scrape_started  # type: ignore[method-assign]
        GroupCommitter.submit = submit_  # type: ignore[method-assign]
        SQLiteStore.upsert_unconfirmed = upsert_unconfirmed  # type: ignore[method-assign]
        Completions.settled = settled_  # type: ignore[method-assign]
        Completions._complete = complete_  # type: ignore[method-assign]

    def engine_stopped(self) -> None:
        rows = [d for d in self.seen.values() if all(step in d for step in STEPS)]
        out: dict[str, Any] = {"tasks": len(rows)}
        for a, b in [*pairwise(STEPS), ("response", "acked")]:
            spans = sorted((d[b] - d[a]) * 1000 for d in rows)
            if spans:
                out[f"{a} -> {b}"] = [round(statistics.median(spans), 1),
                                      round(spans[int(len(spans) * 0.95)], 1)]
        with open(self.path, "w") as fh:
            json.dump(out, fh)

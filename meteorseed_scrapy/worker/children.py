"""Requests yielded by callbacks, on their way to the stream (written before their parents may
be acked).

Each is encoded when it is yielded, its dedup key included (by the project's
``REQUEST_FINGERPRINTER_CLASS`` when it sets one): a request that cannot be written is refused
there, naming it, and only its parent's scrape fails. A batch that fails at the writer for
another reason than Redis is written again child by child: the child that fails alone fails
its parent, never the flush loop (one bad child must not hold every ack behind it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from meteorseed_scrapy.queue.enqueue.enqueue_calls import AddResult, Encoded
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.plumbing.connection import REDIS_FAILURES
from meteorseed_scrapy.task.context import Scrape
from meteorseed_scrapy.task.exec_task import ExecTask

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

BATCH = 500


class Child(NamedTuple):
    encoded: Encoded
    task: ExecTask
    parent: Scrape | None  # None: a request of start()
    dedup: bool


class ChildOutbox:
    """The children not yet written, in the order they were yielded."""

    def __init__(self, writer: TaskWriter, stats: StatsCollector, *,
                 on_written: Callable[[str], None],
                 on_new_urls: Callable[[Iterable[str]], None],
                 on_batch: Callable[[list[ExecTask], tuple[bool, ...]], None] | None = None
                 ) -> None:
        self.writer = writer
        self.stats = stats
        self._on_written = on_written  # parent task id: one of its children is through
        self._on_new_urls = on_new_urls  # the seed ids of children never seen before
        self._on_batch = on_batch  # (children written, which were new: not duplicates)
        self.queue: list[Child] = []

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, task: ExecTask, parent: Scrape | None, dedup: bool) -> None:
        """Queue ``task``; raises :class:`~meteorseed_scrapy.task.validation.TaskError` (too
        large, not encodable, not fingerprinted) without queueing it."""
        self.queue.append(Child(self.writer.encode(task, dedup), task, parent, dedup))

    async def flush(self) -> None:
        alone = 0  # children to write one at a time: their batch failed, not Redis
        while self.queue:
            batch = self.queue[:1 if alone else BATCH]
            try:
                result = await self.writer.enqueue([child.encoded for child in batch])
            except REDIS_FAILURES:
                raise
            except Exception as exc:
                if len(batch) > 1:
                    alone = len(batch)
                    continue
                self._refused(batch[0], exc)
            else:
                self._written(batch, result)
            del self.queue[: len(batch)]
            alone = max(0, alone - 1)

    def _written(self, batch: list[Child], result: AddResult) -> None:
        if self._on_batch is not None:
            self._on_batch([child.task for child in batch], result.fresh)
        self.stats.inc_value("meteorseed/children/enqueued", result.enqueued)
        self.stats.inc_value("meteorseed/children/duplicates", result.duplicates)
        # New URLs found: the yield of their seed (adaptive schedules).
        self._on_new_urls([child.task.seed_id for child, fresh
                           in zip(batch, result.fresh, strict=True) if fresh and child.dedup])
        for child in batch:
            if child.parent is not None:
                self._on_written(child.parent.task.task_id)

    def _refused(self, child: Child, exc: Exception) -> None:
        task = child.task
        logger.error("Cannot write the task of yielded request %s: %s: %s", task.url,
                     type(exc).__name__, exc, exc_info=exc)
        self.stats.inc_value("meteorseed/children/rejected")
        if child.parent is not None:
            child.parent.fail(f"yielded request {task.url}: {type(exc).__name__}: {exc}")
            self._on_written(child.parent.task.task_id)


__all__ = ["ChildOutbox"]

"""This worker's own new tasks on their way through the stream: written (or about to be), not
yet read back.

On stock Scrapy a request yielded by ``start()`` or a callback is in the scheduler at once and
competes by priority with every other one. Here it goes through Redis first, so the scheduler,
choosing between a local request (one crawled by hand, outside any task) and the stream's
tasks, counts these too: a local request of lower priority waits for them
(``test_engine_loop::test_default``). Each counts until read here, or for :data:`COMING_MAX_S`
(another worker may take it, or Redis be away), so a local request never waits longer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from meteorseed_scrapy.task.exec_task import ExecTask

COMING_MAX_S = 1.0


class ComingTasks:
    def __init__(self) -> None:
        self._coming: dict[str, tuple[int, float]] = {}  # task id -> (priority, since)

    def added(self, task: ExecTask) -> None:
        now = time.monotonic()
        self._expire(now)  # (most go to other workers in a fleet: none is kept for long)
        self._coming[task.task_id] = (task.priority, now)

    def written(self, tasks: Sequence[ExecTask], fresh: Sequence[bool]) -> None:
        for task, new in zip(tasks, fresh, strict=False):
            if not new:  # a duplicate: never written, never coming
                self._coming.pop(task.task_id, None)

    def arrived(self, task_id: str) -> None:
        self._coming.pop(task_id, None)

    def best(self) -> int | None:
        """The highest priority still on its way (None: none)."""
        self._expire(time.monotonic())
        return max((priority for priority, _ in self._coming.values()), default=None)

    def _expire(self, now: float) -> None:
        # Oldest first (a dict keeps the order they were added in).
        while self._coming:
            task_id, (_, since) = next(iter(self._coming.items()))
            if now - since <= COMING_MAX_S:
                return
            del self._coming[task_id]

    def __len__(self) -> int:
        return len(self._coming)


__all__ = ["COMING_MAX_S", "ComingTasks"]

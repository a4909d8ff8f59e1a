"""Tasks read and not started yet, per site, served by priority as Scrapy's scheduler serves them
(:class:`WaitingTasks`), and this worker's own new tasks on their way to it (:class:`ComingTasks`).

A read takes the highest band first, but a band holds a range of priorities, and tasks read at
different times wait here together: each site's queue is ordered by (realtime lane first, then
the task's priority, highest first, then arrival), so the worker always starts the most urgent
task it holds, whatever order the streams gave them in.

On stock Scrapy a request yielded by ``start()`` or a callback is in the scheduler at once and
competes by priority with every other one. Here it goes through Redis first, so the scheduler,
choosing between a local request (one crawled by hand, outside any task) and the stream's
tasks, counts those on their way too: a local request of lower priority waits for them
(``test_engine_loop::test_default``). Each counts until read here, or for :data:`COMING_MAX_S`
(another worker may take it, or Redis be away), so a local request never waits longer.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterator, Sequence

from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.ledger import Entry

COMING_MAX_S = 1.0

#: (not urgent, -priority, arrival): the smallest goes first.
Rank = tuple[bool, int, int]
_LAST: Rank = (True, 2**63, 2**63)


class WaitingTasks:
    """Per-site priority queues of entries, with the interface the dispatcher uses."""

    def __init__(self, urgent: Callable[[Entry], bool]) -> None:
        self._urgent = urgent  # a realtime-lane task goes ahead of its site's other tasks
        self._queues: dict[str, list[tuple[Rank, Entry]]] = {}
        self._arrival = itertools.count()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def append(self, site: str, entry: Entry) -> None:
        rank = (not self._urgent(entry), -entry.task.priority, next(self._arrival))
        heapq.heappush(self._queues.setdefault(site, []), (rank, entry))
        self._size += 1

    def count(self, site: str) -> int:
        return len(self._queues.get(site, ()))

    def head(self, site: str) -> Rank:
        """The rank of the site's next entry (the last of all ranks when it has none)."""
        queue = self._queues.get(site)
        return queue[0][0] if queue else _LAST

    def pop(self, site: str) -> Entry | None:
        queue = self._queues.get(site)
        if not queue:
            return None
        _, entry = heapq.heappop(queue)
        self._size -= 1
        if not queue:
            del self._queues[site]
        return entry

    def take_all(self, site: str) -> list[Entry]:
        """The site's entries, in the order they would be served."""
        queue = self._queues.pop(site, [])
        self._size -= len(queue)
        return [entry for _, entry in sorted(queue, key=lambda pair: pair[0])]

    def sites(self) -> list[str]:
        return list(self._queues)

    def __iter__(self) -> Iterator[Entry]:
        for queue in list(self._queues.values()):
            yield from [entry for _, entry in queue]


class ComingTasks:
    """This worker's new tasks on their way through the stream: written (or about to be), not
    yet read back."""

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


__all__ = ["COMING_MAX_S", "ComingTasks", "WaitingTasks"]

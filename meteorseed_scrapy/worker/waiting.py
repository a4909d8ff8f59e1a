"""Tasks read and not started yet, per site, served by priority as Scrapy's scheduler serves them.

A read takes the highest band first, but a band holds a range of priorities, and tasks read at
different times wait here together: each site's queue is ordered by (realtime lane first, then
the task's priority, highest first, then arrival), so the worker always starts the most urgent
task it holds, whatever order the streams gave them in.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from meteorseed_scrapy.worker.ledger import Entry

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


__all__ = ["WaitingTasks"]

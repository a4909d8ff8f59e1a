"""Start requests paced as Scrapy's own scheduler paces them, though they go through Redis.

On stock Scrapy a start request the downloader has room for is downloading before ``start()``
is asked for the next one: so ``engine.needs_backout()`` is true by then, and the lazy-start
pattern (``if engine.needs_backout(): await signals.wait_for(scheduler_empty)``) holds the
iteration while requests are in flight, letting the requests their callbacks yield go first.
Here a start request becomes a task in the stream, and comes back through a read: without a
pause ``start()`` would run on while the first request is on its way, and every start request
would be in the stream before the first download began (all at once, and ahead of the
callbacks' requests).

So after each start request the iteration waits until that request's fate is known here: it
was a duplicate, it started downloading on this worker, or a read of this worker that began
after it was written did not get it (another worker did), or it was parked for later (its site
may not be fetched now); or until this worker holds all the tasks it may (it reads no more), or
the engine backs out.
Never longer than :data:`PACE_MAX_S` (a site waiting for its permits, Redis away).

The iterator is the engine's (private: :mod:`~meteorseed_scrapy.scrapy_internals`): where it is
missing, start requests are not paced (and the lazy-start pattern sees every start request at
once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy import Request

from meteorseed_scrapy.scrapy_internals import replace_start_iterator, start_iterator
from meteorseed_scrapy.task.exec_task import ExecTask

if TYPE_CHECKING:
    from scrapy.core.engine import ExecutionEngine

logger = logging.getLogger(__name__)

PACE_MAX_S = 1.0  # the longest a start request holds the next one back


@dataclass(eq=False)
class StartWatch:
    """What became of the task of the start request last enqueued."""

    request: Request
    task: ExecTask
    written: bool = False
    fresh: bool = True  # (False: a duplicate, never written)
    read_mark: int = -1  # reads started when it was written: a later one missed it if not here
    here: bool = False  # read by this worker
    started: bool = False  # handed to the downloader (or parked for later)


class StartPacing:
    def __init__(self, engine: ExecutionEngine, reads: Callable[[], tuple[int, int]],
                 full: Callable[[], bool]) -> None:
        self._engine = engine
        self._reads = reads  # (reads started, reads done) by this worker's read loop
        self._full = full  # this worker holds all the tasks it may: it reads no more
        self._watch: StartWatch | None = None
        self.progress = asyncio.Event()  # something a waiting start may care about changed

    def install(self) -> bool:
        """Wrap the engine's start iterator; False (not paced) where it has none."""
        start = start_iterator(self._engine)
        if start is None:
            logger.debug("No start iterator on the engine: start requests are not paced")
            return False
        replace_start_iterator(self._engine, self._paced(start))
        return True

    # -- what the pump reports ---------------------------------------------------------------
    def enqueued(self, request: Request, task: ExecTask) -> None:
        """A request without a parent (from ``start()``) is to be written as ``task``."""
        self._watch = StartWatch(request, task)

    def written(self, tasks: Sequence[ExecTask], fresh: Sequence[bool]) -> None:
        watch = self._watch
        if watch is not None:
            for task, new in zip(tasks, fresh, strict=False):
                if task is watch.task:
                    watch.written, watch.fresh, watch.read_mark = True, new, self._reads()[0]
        self.progress.set()

    def booked(self, task_id: str) -> None:
        if self._watch is not None and self._watch.task.task_id == task_id:
            self._watch.here = True
        self.progress.set()

    def started(self, task_id: str) -> None:
        if self._watch is not None and self._watch.task.task_id == task_id:
            self._watch.started = True
        self.progress.set()

    # -- the pause ---------------------------------------------------------------------------
    async def _paced(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item_or_request in start:
            yield item_or_request  # (the engine schedules it before it asks for the next)
            watch = self._watch
            if watch is not None and watch.request is item_or_request:
                await self._settle(watch)

    async def _settle(self, watch: StartWatch) -> None:
        end = time.monotonic() + PACE_MAX_S
        while not self._settled(watch):
            left = end - time.monotonic()
            if left <= 0:
                return
            self.progress.clear()
            # (the engine's backing out and the downloads are not reported: looked at often)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.progress.wait(), min(left, 0.02))

    def _settled(self, watch: StartWatch) -> bool:
        if watch.started or (watch.written and not watch.fresh) or self._full():
            return True
        if watch.written and not watch.here and self._reads()[1] > watch.read_mark:
            return True  # a read that began after it was written did not get it
        try:
            return bool(self._engine.needs_backout())
        except (AssertionError, AttributeError):  # (the engine is not running any more)
            return True


__all__ = ["PACE_MAX_S", "StartPacing", "StartWatch"]

"""Telling a blocked event loop from an unreachable Redis.

A callback, a parse or a pipeline that holds the reactor (and often the GIL) for seconds makes
every Redis command in flight time out when the loop runs again: the worker's loops then saw
"Redis unavailable" although Redis answered all along. :class:`StallWatch` sleeps a short
beat over and over; a beat that ends much later than asked is a stall, logged as one (how
long, that Redis is not to blame), and a Redis failure seen right after it is that stall's
effect, not an outage.
"""

from __future__ import annotations

import asyncio
import logging
import time

logger = logging.getLogger(__name__)


class StallWatch:
    #: Seconds between beats, and how late a beat must end to count as a stall.
    BEAT_S = 0.25
    STALL_S = 5.0
    #: A Redis failure this soon (s) after a stall ended is put down to it.
    AFTERMATH_S = 5.0

    def __init__(self) -> None:
        self.last: tuple[float, float] | None = None  # (when it ended, how long), monotonic
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.BEAT_S)
            late = time.monotonic() - before - self.BEAT_S
            if late >= self.STALL_S:
                self.stalled(late)

    def stalled(self, seconds: float, now: float | None = None) -> None:
        self.last = (time.monotonic() if now is None else now, seconds)
        logger.warning("The event loop was blocked for %.1f s (a callback, a parse or a "
                       "pipeline held the reactor): Redis timeouts right after are its effect, "
                       "not an outage", seconds)

    def explains(self, now: float | None = None) -> float | None:
        """How long the stall lasted that a failure seen now follows, or None."""
        if self.last is None:
            return None
        ended, seconds = self.last
        return seconds if (time.monotonic() if now is None else now) - ended \
            <= self.AFTERMATH_S else None


__all__ = ["StallWatch"]

"""Each site's breaker state as this worker sees it, announced when it changes.

The breaker learns its sites' states in the quota loop (``Breaker.flush``, at most every
``FLUSH_INTERVAL_S``); after each step of that loop, states that changed since the last look go
out as the :data:`~meteorseed_scrapy.worker.signals.breaker_state_changed` signal (e.g. to the
metrics endpoint), a site's first state included.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from meteorseed_scrapy.politeness.breaker import FLUSH_INTERVAL_S, Breaker, BreakerState
from meteorseed_scrapy.worker.signals import breaker_state_changed

if TYPE_CHECKING:
    from scrapy.signalmanager import SignalManager


class BreakerStates:
    def __init__(self, step: Callable[[], Awaitable[None]], breaker: Breaker,
                 signals: SignalManager) -> None:
        self._step = step
        self._breaker = breaker
        self._signals = signals
        self._seen: dict[str, BreakerState] = {}
        self._next_look = 0.0

    async def step(self) -> None:
        """The quota loop's step, then the states that changed meanwhile."""
        await self._step()
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + FLUSH_INTERVAL_S
        for site in list(self._breaker.state):
            state = self._breaker.state_of(site)
            if self._seen.get(site) != state:
                self._seen[site] = state
                self._signals.send_catch_log(breaker_state_changed, site=site, state=state)

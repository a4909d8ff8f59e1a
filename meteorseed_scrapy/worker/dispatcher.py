"""Which waiting task may go to the downloader now: the hand-out (:class:`Handout`: retries and
redirects first, then the most urgent task waiting, each with a permit of its site), and the
permits per site with the parking of blocked sites (:class:`Dispatcher`).

The dispatcher runs as one of the worker's background loops. Tasks of a site that may not be
fetched for a while (paused after a 429, held by an operator, or far behind its quota) are
parked in the delayed set rather than kept in memory, so they neither hold download capacity nor
crowd out other sites' tasks. A hold's park is decided as they go (:meth:`PermitDesk.park_wait`:
seconds, not the hold's hour, on a stale view of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from meteorseed_scrapy.politeness.breaker import Breaker, BreakerState
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.permits import PermitDesk, SiteQueues
from meteorseed_scrapy.politeness.policy import SiteLimits
from meteorseed_scrapy.task.context import LEASE_META_KEY
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.worker.ledger import Entry
from meteorseed_scrapy.worker.waiting import WaitingTasks
from meteorseed_scrapy.worker.work_budget import WorkBudget

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull

PARK_AFTER_S = 2.0  # a site that must wait longer than this gives its waiting tasks back
QUEUE_SECONDS = 2.0  # a site keeps at most this many seconds of its quota waiting in memory
MIN_QUEUE = 4


class Dispatcher:
    def __init__(self, desk: PermitDesk, buffer: WaitingTasks, hops: SiteQueues,
                 limits_for: Callable[[str], SiteLimits], breaker: Breaker, *,
                 budget: Callable[[], int],
                 on_change: Callable[[], None],
                 park: Callable[[Entry, float, DeferReason], None],
                 stats: StatsCollector) -> None:
        self.desk = desk
        self.buffer = buffer
        self.hops = hops
        self.limits_for = limits_for
        self.breaker = breaker
        self._budget = budget
        self._on_change = on_change
        self._park = park
        self.stats = stats
        self.wake = asyncio.Event()

    def demand(self) -> dict[str, int]:
        sites = set(self.buffer.sites()) | set(self.hops.sites())
        return {s: self.buffer.count(s) + self.hops.count(s) for s in sites}

    async def step(self) -> None:
        await self.breaker.flush()
        # Leases of finished downloads go back first, so that the refill can reuse them.
        await self.desk.flush()
        before = sum(self.desk.held(s) for s in self.desk.available)
        waits = await self.desk.refill(self.demand(), self._budget())
        for site, wait in waits.items():
            self._park_excess(site, self.desk.park_wait(site, wait))
        if sum(self.desk.held(s) for s in self.desk.available) > before:
            self._on_change()
        pause = min([*waits.values(), 0.5])
        self.wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wake.wait(), max(0.005, pause))

    def _park_excess(self, site: str, wait: float) -> None:
        if wait > PARK_AFTER_S:
            keep = 0
        else:
            rate = self.limits_for(site).rate
            keep = max(MIN_QUEUE, math.ceil(rate * QUEUE_SECONDS))
        if self.buffer.count(site) <= keep:
            return
        entries = self.buffer.take_all(site)
        if self.breaker.state_of(site) is not BreakerState.CLOSED:
            # A sick or recovering site's scarce permits go to its most important tasks.
            entries.sort(key=lambda e: -e.task.priority)
        for entry in entries[:keep]:
            self.buffer.append(site, entry)
        rate = self.limits_for(site).rate
        parked = entries[keep:]
        degraded = 0
        # Why they wait, recorded with them (meteorseed status): a site that cannot be fetched
        # for a while is sick (its breaker not closed) or paused (a 429/403, or far behind its
        # quota); else it just has more waiting than its rate serves soon.
        why = (DeferReason.SICK if self.breaker.state_of(site) is not BreakerState.CLOSED
               else DeferReason.PAUSED if wait > PARK_AFTER_S else DeferReason.QUOTA)
        for i, entry in enumerate(parked):
            # Spread them over the site's quota so they do not all come back at once.
            delay = max(wait, 0.0, self.breaker.degraded(site, entry.task.priority))
            held_back = delay > max(wait, 0.0)  # a sick site's permits go to higher priorities
            degraded += held_back
            self._park(entry, delay + (keep + i) / rate,
                       DeferReason.PRIORITY if held_back else why)
        if parked:
            self.stats.inc_value(f"meteorseed/quota/parked/{site}", len(parked))
        if degraded:
            self.stats.inc_value(f"meteorseed/breaker/{site}/degraded", degraded)


class Handout:
    """The requests handed to Scrapy: retries and redirects of started tasks first (``hops``),
    then the most urgent task waiting (``start(site)`` starts the site's next one), each with a
    permit of its site when politeness is on (``gate``: the :class:`Dispatcher` gets them)."""

    def __init__(self, buffer: WaitingTasks, budget: WorkBudget,
                 start: Callable[[str], Request | None], stats: StatsCollector, *,
                 gate: SiteGate | None, limits_for: Callable[[str], SiteLimits],
                 breaker: Breaker, on_change: Callable[[], None],
                 park: Callable[[Entry, float, DeferReason], None], full: RedisFull) -> None:
        self.buffer, self.hops = buffer, SiteQueues()  # hops: retries/redirects, per site
        self._budget, self._start = budget, start
        self.desk = PermitDesk(gate, stats, full) if gate is not None else None
        self.dispatcher = None if self.desk is None else Dispatcher(
            self.desk, buffer, self.hops, limits_for, breaker, budget=self._permits,
            on_change=on_change, park=park, stats=stats)

    def next_request(self) -> Request | None:
        """The request to download now, holding a permit of its site (None: nothing may go)."""
        desk = self.desk
        sites = list(desk.ready_sites()) if desk is not None else (
            self.hops.sites() + self.buffer.sites())
        # Retries and redirects of started tasks first, then the most urgent task waiting
        # (Scrapy's scheduler too serves the highest priority first, whatever its site).
        hops = [(site, self.hops.pop) for site in sites if self.hops.count(site)]
        waiting = [(site, self._start) for site in sorted(sites, key=self.buffer.head)]
        for site, take in [*hops, *waiting]:
            request = take(site)
            if request is None:
                continue
            if desk is not None:
                request.meta[LEASE_META_KEY] = desk.take(site)
            return request
        return None

    def hop(self, site: str, request: Request) -> None:
        """A retry or redirect of a started task: it goes out again with a permit."""
        self.download_done(request)
        self.hops.append(site, request)
        self.want_permits()

    def download_done(self, request: Request) -> None:
        """The download that carried ``request``'s permit is over: give the permit back."""
        lease = request.meta.pop(LEASE_META_KEY, None)
        if self.desk is not None and lease:
            self.desk.done(lease)
            self.want_permits()

    def want_permits(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.wake.set()

    def _permits(self) -> int:
        held = sum(len(v) for v in self.desk.available.values()) if self.desk else 0
        return self._budget.permits(held)


__all__ = ["Dispatcher", "Handout"]

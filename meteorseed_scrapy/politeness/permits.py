"""Local bookkeeping of dispatch permits and of tasks waiting for one, per site.

The engine's ``next_request()`` is synchronous, so permits are leased from the gate in the
background, a few at a time and only for sites with tasks waiting here, and handed out from
memory. A site waiting for tokens holds neither a download slot nor the reactor.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.politeness.gate import SiteGate, group_by_site
from meteorseed_scrapy.politeness.site_errors import SITE_ERRORS, SiteFaults
from meteorseed_scrapy.queue.consume.delayed_set import STALE_PARK_S, STALE_VIEW_S

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull

#: The longest a site with tasks waiting here goes without asking the gate again, whatever
#: wait the gate said (its tasks are parked for that wait): an operator may resume a held site,
#: or change its limits, meanwhile.
RECHECK_CAP_S = 5.0


class SiteQueues:
    """FIFO queues per site, with a round-robin order over sites. An ``urgent`` item (a
    realtime-lane task) goes ahead of the site's other items, behind earlier urgent ones."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Any]] = {}
        self._urgent: dict[str, int] = {}  # site -> urgent items at the front of its queue
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def append(self, site: str, item: Any, urgent: bool = False) -> None:
        queue = self._queues.setdefault(site, deque())
        if urgent:
            ahead = self._urgent.get(site, 0)
            queue.insert(ahead, item)
            self._urgent[site] = ahead + 1
        else:
            queue.append(item)
        self._size += 1

    def count(self, site: str) -> int:
        queue = self._queues.get(site)
        return len(queue) if queue else 0

    def pop(self, site: str) -> Any | None:
        queue = self._queues.get(site)
        if not queue:
            return None
        self._size -= 1
        item = queue.popleft()
        if self._urgent.get(site):
            self._urgent[site] -= 1
        if not queue:
            del self._queues[site]
            self._urgent.pop(site, None)
        return item

    def take_all(self, site: str) -> list[Any]:
        """The site's items, urgent ones first (append them again to keep that order)."""
        queue = self._queues.pop(site, None) or deque()
        self._urgent.pop(site, None)
        self._size -= len(queue)
        return list(queue)

    def sites(self) -> list[str]:
        return list(self._queues)

    def __iter__(self) -> Iterator[Any]:
        for queue in list(self._queues.values()):
            yield from list(queue)


class PermitDesk:
    def __init__(self, gate: SiteGate, stats: StatsCollector,
                 full: RedisFull | None = None) -> None:
        self.gate = gate
        self.stats = stats
        self.available: dict[str, list[str]] = {}
        self.in_flight: dict[str, str] = {}  # lease id -> site
        self.retry_at: dict[str, float] = {}  # site -> monotonic time to ask again
        # site -> monotonic time the gate was asked when it said an operator holds the site:
        # the hold was true then at the earliest (a loop blocked while its reply waited counts).
        self.held_seen: dict[str, float] = {}
        self.to_release: list[tuple[str, str]] = []
        self._next_renew = 0.0
        self._order: deque[str] = deque()
        # A site whose gate state Redis refuses (a full Redis: the worker's one view of it).
        self.faults = SiteFaults("gate", stats, full)

    def ready_sites(self) -> Iterator[str]:
        """Sites holding permits, round-robin so that one busy site does not starve others.
        A site this worker just saw paused (its 429) is skipped: its permits go back."""
        for _ in range(len(self._order)):
            site = self._order[0]
            self._order.rotate(-1)
            if self.available.get(site) and not self.gate.held_back(site):
                yield site

    def take(self, site: str) -> str | None:
        leases = self.available.get(site)
        if not leases:
            return None
        lease = leases.pop()
        self.in_flight[lease] = site
        return lease

    def done(self, lease: str | None) -> None:
        """The download holding ``lease`` finished (response, failure or a new hop)."""
        site = self.in_flight.pop(lease, None) if lease else None
        if site is not None:
            self.to_release.append((site, lease))  # type: ignore[arg-type]
            # A lease of ours comes free: a site held back by its concurrency cap may go on.
            self.retry_at.pop(site, None)

    def held(self, site: str) -> int:
        return len(self.available.get(site, ()))

    async def refill(self, demand: dict[str, int], budget: int) -> dict[str, float]:
        """Lease permits for ``demand`` (site -> tasks waiting here), at most ``budget`` in all.

        Returns how long each site that got nothing must wait.
        """
        waits: dict[str, float] = {}
        now = time.monotonic()
        for site, wanted in demand.items():
            paused = self.gate.held_back(site)
            if paused:
                # Granted before the pause: given back, so that what goes out after it holds a
                # permit granted after it (a 429 to it is then a new strike).
                self.to_release.extend((site, lease) for lease in self.available.pop(site, ()))
                waits[site] = paused
                continue
            extra = self.held(site) - wanted
            if extra > 0:  # tasks left (taken over, parked): give the leases back
                self.to_release.extend((site, self.available[site].pop()) for _ in range(extra))
            missing = wanted - self.held(site)
            if missing <= 0 or budget <= 0 or self.retry_at.get(site, 0.0) > now:
                if self.retry_at.get(site, 0.0) > now:
                    waits[site] = self.retry_at[site] - now
                continue
            asked = time.monotonic()
            try:
                grant = await self.gate.acquire(site, min(missing, budget))
            except SITE_ERRORS as exc:  # this site's state is corrupt: it waits, others go on
                waits[site] = self.faults.failed(site, exc)
                self.retry_at[site] = now + waits[site]
                continue
            self.faults.ok(site)
            if grant.held:
                self.held_seen[site] = asked
            else:
                self.held_seen.pop(site, None)
            if grant.lease_ids:
                budget -= len(grant.lease_ids)
                self.available.setdefault(site, []).extend(grant.lease_ids)
                if site not in self._order:
                    self._order.append(site)
                self.retry_at.pop(site, None)
            else:
                self.retry_at[site] = now + min(grant.wait_s, RECHECK_CAP_S)
                waits[site] = grant.wait_s
                # Scrapy types a stat as a count (int); this one sums seconds, and its
                # dict-backed collectors add a float as well.
                self.stats.inc_value(f"meteorseed/quota/wait_s/{site}",
                                     grant.wait_s)  # type: ignore[arg-type]
        for site in [s for s in self._order if s not in demand and not self.available.get(s)]:
            self._order.remove(site)
        for site in [s for s in self.held_seen if s not in demand]:
            del self.held_seen[site]
        return waits

    def park_wait(self, site: str, wait: float) -> float:
        """How long ``site``'s tasks are parked for a ``wait`` from :meth:`refill`, decided
        now. On a view of an operator's hold older than ``STALE_VIEW_S`` (the loop was
        blocked, Redis slow, other sites awaited first), ``STALE_PARK_S`` at most, and the
        gate is asked again by then: a resume meanwhile may have run its passes before these
        tasks reach the delayed set, and nothing else would wake them before the hold's hour."""
        seen = self.held_seen.get(site)
        now = time.monotonic()
        if seen is None or now - seen <= STALE_VIEW_S:
            return wait
        self.retry_at[site] = min(self.retry_at.get(site, math.inf), now + STALE_PARK_S)
        return min(wait, STALE_PARK_S)

    async def flush(self) -> None:
        # Latency samples of adaptive sites go with the permit loop (about once a second).
        await self.gate.flush_samples()
        if self.to_release:
            batch = self.to_release[:500]
            refused = await self.gate.release(batch)
            del self.to_release[: len(batch)]  # refused ones expire by themselves
            for site, exc in refused.items():
                self.faults.failed(site, exc)
        now = time.monotonic()
        if now >= self._next_renew and (self.in_flight or self.available):
            self._next_renew = now + self.gate.lease_ttl_s / 3
            held = [(s, lease) for lease, s in self.in_flight.items()]
            held += [(s, lease) for s, leases in self.available.items() for lease in leases]
            for site, exc in (await self.gate.renew(group_by_site(held))).items():
                self.faults.failed(site, exc)

    def give_back_all(self) -> None:
        for site, leases in self.available.items():
            self.to_release.extend((site, lease) for lease in leases)
        self.available.clear()
        self.to_release.extend((site, lease) for lease, site in self.in_flight.items())
        self.in_flight.clear()

"""How much work a worker asks for: tasks to read ahead, permits to lease, scrapes in progress."""

from __future__ import annotations

from typing import Any

from meteorseed_scrapy.worker.ledger import TaskLedger


class WorkBudget:
    """Counts taken from the engine's downloader and the task ledger, for ``capacity``
    concurrent downloads (``CONCURRENT_REQUESTS``) and ``prefetch`` tasks read ahead."""

    def __init__(self, crawler: Any, ledger: TaskLedger, capacity: int, prefetch: int) -> None:
        self.crawler = crawler
        self.ledger = ledger
        self.capacity = capacity
        self.prefetch = prefetch

    def downloading(self) -> int:
        engine = self.crawler.engine
        return len(engine.downloader.active) if engine and engine.downloader else 0

    def settling(self) -> int:
        """Tasks whose response reached the scraper and whose scrape (callback, item commits)
        is not finished yet."""
        return sum(1 for e in self.ledger.entries() if e.response_at and e.outcome is None)

    def want(self) -> int:
        """Tasks worth reading now."""
        active = self.downloading()
        # Tasks whose response arrived and only wait for their commit hold no download capacity.
        started = sum(1 for e in self.ledger.entries() if e.started and not e.response_at)
        return max(0, self.capacity + self.prefetch - max(active, started))

    def permits(self, desk: Any) -> int:
        """Permits worth leasing now: free download capacity, plus a quarter of it ahead, not
        already covered by the permits ``desk`` holds. The permits ahead are in hand when a
        download ends: without them its slot waited a round trip to the gate (measured: 7 %
        of an unthrottled worker's throughput). They are charged to the site like any other,
        so a site's rate and concurrency cap hold all the same."""
        held = sum(len(v) for v in desk.available.values()) if desk is not None else 0
        ahead = max(1, self.capacity // 4)
        return max(0, self.capacity + ahead - self.downloading() - held)


__all__ = ["WorkBudget"]

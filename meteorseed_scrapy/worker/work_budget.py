"""How much work a worker asks for: tasks to read ahead, permits to lease, scrapes in progress."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meteorseed_scrapy.settings import scrapy_count, setting
from meteorseed_scrapy.validators import to_integer
from meteorseed_scrapy.worker.ledger import TaskLedger

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings


@dataclass(frozen=True)
class WorkSizes:
    """For ``capacity`` concurrent downloads (``CONCURRENT_REQUESTS``): tasks read ahead (half
    the capacity), reads batched (a quarter), and requests started and not yet scraped
    (downloading, or their response in the scraper and the store) before new work waits
    (``METEORSEED_MAX_SETTLING``, by default the capacity: no more work in progress than
    Scrapy would download at once; at least two)."""

    capacity: int
    max_settling: int

    @property
    def prefetch(self) -> int:
        return max(1, self.capacity // 2)

    @property
    def read_batch(self) -> int:
        return max(1, self.capacity // 4)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> WorkSizes:
        # (a capacity of 0, Scrapy's "no limit", is refused when a worker crawl opens:
        # meteorseed_scrapy.worker.crawl; a local crawl takes it as Scrapy does)
        capacity = scrapy_count(settings, "CONCURRENT_REQUESTS")
        return cls(capacity, max(2, max_settling(settings) or capacity))


def max_settling(settings: BaseSettings) -> int | None:
    """``METEORSEED_MAX_SETTLING``: a whole number >= 1, or None (the worker's capacity)."""
    value = setting(settings, "METEORSEED_MAX_SETTLING")
    return None if value is None else to_integer(value, "METEORSEED_MAX_SETTLING", minimum=1)


class WorkBudget:
    """Counts taken from the downloader and the task ledger."""

    def __init__(self, ledger: TaskLedger, sizes: WorkSizes,
                 downloading: Callable[[], int]) -> None:
        self.ledger = ledger
        self.sizes = sizes
        self.downloading = downloading  # downloads in progress now

    def settling(self) -> int:
        """Tasks whose response reached the scraper and whose scrape (callback, item commits)
        is not finished yet."""
        return sum(1 for e in self.ledger.entries() if e.response_at and e.happened is None)

    def may_dispatch(self) -> bool:
        """Whether new work may go out: the requests downloading and the responses waiting for
        the scraper and the store are enough to keep both busy; more would only wait in line,
        adding to every task's response-to-ack time. (Downloads count: on a fast site each is a
        response in the scraper a moment later, so counting only those already there let a
        full downloader's worth through at every scrape that finished.)"""
        return self.settling() + self.downloading() < self.sizes.max_settling

    def want(self) -> int:
        """Tasks worth holding now (read and not finished)."""
        active = self.downloading()
        # Tasks whose response arrived and only wait for their commit hold no download capacity.
        started = sum(1 for e in self.ledger.entries() if e.started and not e.response_at)
        return max(0, self.sizes.capacity + self.sizes.prefetch - max(active, started))

    def permits(self, held: int) -> int:
        """Permits worth leasing now, ``held`` being those in hand: free download capacity, plus
        a quarter of it ahead. The permits ahead are in hand when a download ends: without them
        its slot waited a round trip to the gate (measured: 7 % of an unthrottled worker's
        throughput). They are charged to the site like any other, so a site's rate and
        concurrency cap hold all the same."""
        ahead = max(1, self.sizes.capacity // 4)
        return max(0, self.sizes.capacity + ahead - self.downloading() - held)



__all__ = ["WorkBudget", "WorkSizes", "max_settling"]

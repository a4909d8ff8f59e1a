"""A task's callback makes at most ``METEORSEED_MAX_CHILDREN_PER_TASK`` requests: a page of a
million links would otherwise hold its task (and a million encoded children in memory) until
every one is written.

:class:`ChildrenCapMiddleware` is a spider middleware placed nearest the spider (order
10,000: above all of Scrapy's, 1000 at most). Once a task's callback yielded the cap's number of
requests, the next ones are dropped there, before Scrapy's own spider middlewares, the engine and
the scheduler spend time on each (about 220 µs a request here). Items always pass. The requests
dropped get one warning per task naming its URL and the cap, ``meteorseed/children/over_cap``
(one per request) and an anomaly on the task's completion record
(:attr:`~meteorseed_scrapy.task.context.Scrape.children_dropped`). The cap counts what the
callback yields, before other middlewares filter (depth, URL length, a project's own).

Not counted: requests that no task's callback yielded (``start()``, a local crawl), and an
errback's (Scrapy hands an errback's output to no spider middleware; how many it yields is the
spider's code's doing, not a page's). A project that lists this middleware with ``None`` in
``SPIDER_MIDDLEWARES`` has no cap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.http import Response

from meteorseed_scrapy.settings import integer_setting
from meteorseed_scrapy.task.context import Scrape, current_scrape, task_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

CAP_SETTING = "METEORSEED_MAX_CHILDREN_PER_TASK"
OVER_CAP_STAT = "meteorseed/children/over_cap"
DROPS_PER_TURN = 1000  # requests dropped between two turns of the event loop (~60 ms here)


class ChildrenCapMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        self.cap = integer_setting(crawler.settings, CAP_SETTING, minimum=1)
        self._stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ChildrenCapMiddleware:
        return cls(crawler)

    def process_spider_output(self, response: Response | None, result: Iterable[Any],
                              spider: Spider | None = None) -> Iterable[Any]:
        scrape = _scrape_of(response)
        for one in result:
            if scrape is None or not isinstance(one, Request) or self._keep(scrape, one):
                yield one

    async def process_spider_output_async(self, response: Response | None,
                                          result: AsyncIterator[Any],
                                          spider: Spider | None = None) -> AsyncIterator[Any]:
        scrape = _scrape_of(response)
        async for one in result:
            if scrape is None or not isinstance(one, Request) or self._keep(scrape, one):
                yield one
            elif scrape.children_dropped % DROPS_PER_TURN == 0:
                # A dropped request awaits nothing: without a turn of the event loop now and
                # then, a callback yielding a million would hold it for a minute.
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # (the second one after the I/O the first let in)

    def _keep(self, scrape: Scrape, request: Request) -> bool:
        """Whether ``request`` is within the cap of ``scrape``'s task; else dropped, said once."""
        if scrape.children_yielded < self.cap:
            scrape.children_yielded += 1
            return True
        self._stats.inc_value(OVER_CAP_STAT)
        if not scrape.children_dropped:
            task = scrape.task
            logger.warning("Task %s (%s) yielded more than %s (%d) requests: the first %d are"
                           " its children, the rest are dropped (first dropped: %s)",
                           task.task_id, task.url, CAP_SETTING, self.cap, self.cap,
                           request.url)
        scrape.children_dropped += 1
        return False


def _scrape_of(response: Response | None) -> Scrape | None:
    """The scrape of ``response``'s task, current while its callback's output is handled
    (None: no task of ours)."""
    scrape = current_scrape()
    task = task_of(response) if response is not None else None
    if scrape is None or task is None or task.task_id != scrape.task.task_id:
        return None
    return scrape


__all__ = ["CAP_SETTING", "OVER_CAP_STAT", "ChildrenCapMiddleware"]

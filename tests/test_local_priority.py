"""Local requests (crawled by hand, outside any task) and the stream's tasks are served by
priority, as Scrapy's scheduler serves them, the worker's own new tasks on their way through
the stream included; a local request goes first on a tie. Scrapy's
tests/test_engine_loop.py::TestRequestSendOrder::test_default, on a real Redis and the demo site."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request, Spider, signals
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.testing.sites import DemoSite
from tests.internals_helpers import REACTORLESS


def crawl_order(tmp_path: Path, redis_url: str, namespace: str, site: DemoSite) -> list[int]:
    def request(num: int, priority: int = 0) -> Request:
        return Request(f"{site.url}/news/article/{num}", priority=priority)

    class OrderSpider(Spider):
        name = "order"

        async def start(self) -> AsyncIterator[Any]:
            assert self.crawler.engine is not None and self.crawler.engine._slot is not None
            yield request(1)
            for local in (request(2, priority=1), request(5)):  # by hand: local requests
                self.crawler.engine._slot.scheduler.enqueue_request(local)
            yield request(6)
            yield request(3, priority=1)
            yield request(4, priority=1)

        def parse(self, response: Response) -> None:
            return None

    order: list[int] = []

    def reached(request: Request, spider: Spider) -> None:
        order.append(int(request.url.rsplit("/", 1)[1]))

    async def crawl() -> None:
        crawler = get_crawler(OrderSpider, {
            "ADDONS": {"meteorseed_scrapy.addon.MeteorSeedAddon": 0},
            "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
            "METEORSEED_STORE_URI": f"sqlite:///{tmp_path / 'items.db'}",
            "METEORSEED_IDLE_CLOSE": 1, "CONCURRENT_REQUESTS": 1, "ROBOTSTXT_OBEY": False,
            "METEORSEED_SITE_RATE": 1000, "METEORSEED_SITE_BURST": 1000,
        })
        crawler.signals.connect(reached, signals.request_reached_downloader)
        await crawler.crawl_async()

    asyncio.run(crawl())
    return order


@pytest.mark.skipif(not REACTORLESS,
                    reason="crawls in this process with asyncio.run: needs Scrapy's reactorless "
                    "mode (2.15+); Scrapy 2.14's in-process crawls need its reactor running")
def test_a_local_request_waits_for_the_workers_own_tasks_of_higher_priority(
    tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite
) -> None:
    # 5 (local, priority 0) after 3 and 4 (start requests, priority 1, through the stream);
    # 2 (local, priority 1) ahead of them; 6 (start, priority 0) after 5.
    assert crawl_order(tmp_path, redis_url, namespace, demo_site) == [1, 2, 3, 4, 5, 6]

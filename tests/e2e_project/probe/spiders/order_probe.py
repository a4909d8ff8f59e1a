"""A spider whose start() pauses lazily, as Scrapy's docs show (start-requests-lazy), and whose
first page yields one request: the order requests reach the downloader is kept in the stats."""

from __future__ import annotations

from typing import Any

import scrapy
from scrapy import signals


class OrderProbeSpider(scrapy.Spider):
    name = "order_probe"

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> OrderProbeSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._reached, signals.request_reached_downloader)
        return spider

    def _reached(self, request: scrapy.Request, spider: scrapy.Spider) -> None:
        assert self.crawler.stats is not None
        order = self.crawler.stats.get_value("probe/order") or []
        self.crawler.stats.set_value("probe/order", [*order, request.url.rsplit("=", 1)[1]])

    async def start(self) -> Any:
        base = self.base_url  # (spider argument)
        for n in (1, 2, 4):
            if self.crawler.engine.needs_backout():
                await self.crawler.signals.wait_for(signals.scheduler_empty)
            yield scrapy.Request(f"{base}/slow/200?n={n}", meta={"site_id": "order"})

    def parse(self, response: Any) -> Any:
        if response.url.endswith("n=1"):
            yield scrapy.Request(response.url.replace("n=1", "n=3"))

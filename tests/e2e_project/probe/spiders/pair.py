"""Two spiders of one project that crawl one site side by side (tests/test_e2e_spider_sets.py):
each follows only its own kind of link and stamps its items with its name, so an item stored
by the wrong spider shows."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import scrapy


class _PairSpider(scrapy.Spider):
    follows = ""  # the path prefix of the links this spider follows

    async def start(self) -> Any:
        return
        yield  # (fed by the stream only)

    def parse(self, response: Any) -> Any:
        yield {"unique_key": urlparse(response.url).path, "parsed_by": self.name,
               "title": response.css("title::text").get()}
        for href in response.css("a::attr(href)").getall():
            if href.startswith(self.follows):
                yield response.follow(href, callback=self.parse)


class PairNewsSpider(_PairSpider):
    name = "pair_news"
    follows = "/news/article/"


class PairShopSpider(_PairSpider):
    name = "pair_shop"
    follows = "/shop/product/"

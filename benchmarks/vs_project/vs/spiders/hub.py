"""One spider, two feeds: a hub page yields DETAILS detail requests; a detail page one item.

``hub`` gets its hubs from the MeteorSeed stream, ``hub_redis`` from scrapy-redis's
``hub_redis:start_urls``; the parsing code is the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import scrapy
from scrapy_redis.spiders import RedisSpider


def detail_urls(hub_url: str) -> list[str]:
    query = parse_qs(urlsplit(hub_url).query)
    base = hub_url.split("/links/", 1)[0]
    hub, details, delay = query["hub"][0], int(query["details"][0]), int(query["delay"][0])
    return [f"{base}/slow/{delay}?hub={hub}&i={i}" for i in range(details)]


class HubMixin:
    def parse(self, response: Any) -> Iterator[Any]:
        for url in detail_urls(response.url):
            yield scrapy.Request(url, callback=self.parse_detail)

    def parse_detail(self, response: Any) -> Iterator[dict[str, Any]]:
        query = parse_qs(urlsplit(response.url).query)
        yield {"unique_key": f"{query['hub'][0]}-{query['i'][0]}", "url": response.url}


class HubSpider(HubMixin, scrapy.Spider):
    name = "hub"


class HubRedisSpider(HubMixin, RedisSpider):
    name = "hub_redis"

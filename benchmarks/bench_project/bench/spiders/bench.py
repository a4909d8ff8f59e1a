"""The benchmark spider: one item per detail page, no link following.

* ``bench`` reads its URLs from the file named by ``-a urls_file=...`` (stock Scrapy) or, with
  no file, gets its work from the MeteorSeed stream (the add-on's scheduler).
* ``bench_redis`` is a scrapy-redis ``RedisSpider`` reading ``bench_redis:start_urls``.

Both parse with the same code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy_redis.spiders import RedisSpider


def parse_article(response: Any) -> dict[str, Any]:
    article = response.css("article")
    return {
        "unique_key": article.attrib.get("id", response.url),
        "url": response.url,
        "title": article.css("h1.title::text").get(),
        "author": article.css(".author::text").get(),
        "date": article.css("time::attr(datetime)").get(),
        "words": len(" ".join(article.css(".body p::text").getall()).split()),
        "related": len(article.css(".related a::attr(href)").getall()),
    }


class BenchSpider(scrapy.Spider):
    name = "bench"

    async def start(self) -> AsyncIterator[Any]:
        path = getattr(self, "urls_file", "")
        if not path:
            return  # MeteorSeed: work comes from the stream
        with open(path) as fh:
            for line in fh:
                url = line.strip()
                if url:
                    yield scrapy.Request(url)

    def parse(self, response: Any) -> Iterator[dict[str, Any]]:
        yield parse_article(response)


class BenchRedisSpider(RedisSpider):
    name = "bench_redis"

    def parse(self, response: Any) -> Iterator[dict[str, Any]]:
        yield parse_article(response)

"""A spider whose behaviour the test URLs choose (see the path checks below)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlparse

import scrapy


class ProbeSpider(scrapy.Spider):
    name = "probe"

    async def start(self) -> Any:
        # Fed by the stream only; `start_urls` (spider argument) go through the stream too.
        for url in (getattr(self, "start_urls_csv", "") or "").split(","):
            if url:
                yield scrapy.Request(url, meta={"site_id": "probe_start"})

    def parse(self, response: Any) -> Any:
        parsed = urlparse(response.url)
        path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
        if "boom" in parsed.query:
            raise ValueError(f"boom at {path}")
        if "badchild" in parsed.query:
            yield scrapy.Request(response.urljoin("/news/article/999"), meta={"obj": object()})
            return
        query = parse_qs(parsed.query)
        if "kids" in query:  # two child requests, the second one to a URL with "fpfail"
            n, number = query["n"][0], int(parsed.path.rsplit("/", 1)[1])
            yield {"unique_key": path, "status": response.status}
            yield response.follow(f"/news/article/{number + 20}?n={n}")
            yield response.follow(f"/news/article/{number + 40}?n={n}&fpfail=1")
            return
        if "fanout" in query:  # a page with many links: one item, then fanout requests
            yield {"unique_key": path, "status": response.status}
            for i in range(int(query["fanout"][0])):
                yield scrapy.Request(response.urljoin(f"/status/200?child={i}"))
            return
        many = query.get("many", [""])[0]
        if many:  # a listing page: many items from one response (then maybe an error)
            for i in range(int(many)):
                yield {"unique_key": f"{path}#{i}", "status": response.status}
            if "fail" in query:
                raise ValueError(f"failed after {many} items at {path}")
            return
        yield {
            "unique_key": path,
            "title": response.css("title::text").get(),
            "status": response.status,
        }
        if getattr(self, "follow", "0") == "1":
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href, callback=self.parse, meta={"from": path})

"""The ``demo`` spider: parses the three shapes of ``meteorseed_scrapy.testing.sites``.

It has no start URLs: with MeteorSeed, work comes from the Redis stream (``scrapy seed-expand``).
Every request it yields becomes a task for any worker, so callbacks are spider methods and
``meta`` holds only JSON values. Every item carries an explicit ``unique_key``: the stored
document's id is ``<site_id>:<unique_key>``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.http import Request, Response

Output = Iterator[Request | dict[str, Any]]


def _number(text: str | None) -> float | None:
    """``"1,299.00"`` -> ``1299.0``."""
    return float(text.replace(",", "")) if text else None


def _clean(text: str | None) -> str | None:
    return " ".join(text.split()) if text else None


class DemoSpider(scrapy.Spider):
    name = "demo"

    def parse(self, response: Response, **kwargs: Any) -> Output:
        """Default callback (a task that names none): route by the shape of the URL."""
        path = urlsplit(response.url).path
        if path.startswith("/news/article/"):
            yield from self.parse_article(response)
        elif path.startswith("/news"):
            yield from self.parse_news_list(response)
        elif path.startswith("/shop/product/"):
            yield from self.parse_product(response)
        elif path.startswith("/shop/category/"):
            yield from self.parse_category(response)
        elif path.startswith("/shop"):
            yield from self.parse_shop(response)
        elif path.startswith("/jobs/api"):
            yield from self.parse_jobs_api(response)
        else:
            self.logger.warning("demo spider: no parser for %s", response.url)

    # -- news: list pages -> articles, plus the next list page ------------------------------
    def parse_news_list(self, response: Response) -> Output:
        page = response.meta.get("list_page", 1)
        for href in response.css("a.article::attr(href)").getall():
            yield response.follow(href, callback=self.parse_article, meta={"list_page": page})
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse_news_list,
                                  meta={"list_page": page + 1})

    def parse_article(self, response: Response) -> Output:
        match = re.search(r"/news/article/(\d+)", response.url)
        if not match:
            return
        yield {
            "unique_key": f"article-{match.group(1)}",
            "title": _clean(response.css("h1.title::text").get()),
            "author": response.css(".author::text").get(),
            "published": response.css("time.date::attr(datetime)").get(),
            "body": "\n\n".join(_clean(p) or "" for p in response.css(".body p::text").getall()),
            "list_page": response.meta.get("list_page"),
        }

    # -- shop: index -> categories -> products ----------------------------------------------
    def parse_shop(self, response: Response) -> Output:
        for href in response.css("a.category::attr(href)").getall():
            yield response.follow(href, callback=self.parse_category)

    def parse_category(self, response: Response) -> Output:
        category = response.css("h1::text").re_first(r"\d+")
        for href in response.css("a.product::attr(href)").getall():
            yield response.follow(href, callback=self.parse_product,
                                  cb_kwargs={"category": int(category) if category else None})

    def parse_product(self, response: Response, category: int | None = None) -> Output:
        sku = response.css(".sku::text").get()
        if not sku:
            return
        price = response.css(".price::text").get()
        yield {
            "unique_key": sku,
            "sku": sku,
            "name": _clean(response.css("h1.name::text").get()),
            "price": price,
            "price_value": _number(price),
            "currency": response.css(".currency::text").get(),
            "in_stock": response.css(".stock::text").get() == "In stock",
            "category": category,
        }

    # -- jobs: a JSON API, several items per page --------------------------------------------
    def parse_jobs_api(self, response: Response) -> Output:
        data = response.json()
        for job in data.get("jobs", []):
            yield {"unique_key": f"job-{job['id']}", "page": data.get("page"), **job}
        if data.get("next"):
            yield response.follow(data["next"], callback=self.parse_jobs_api)

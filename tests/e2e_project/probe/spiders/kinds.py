"""Scrapy's spider classes, each run as a worker and as stock Scrapy on the same local site
(tests/test_e2e_spider_kinds.py). ``-a start_url=URL`` is the start URL; items carry no
``unique_key`` where that is what the test is about (their documents are keyed by position)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import scrapy
from price_parser import Price
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, CSVFeedSpider, Rule, SitemapSpider, XMLFeedSpider


def _start(spider: scrapy.Spider, kwargs: dict[str, Any]) -> None:
    spider.start_urls = [kwargs["start_url"]]


class KindsCrawlSpider(CrawlSpider):
    name = "kinds_crawl"
    rules = (
        Rule(LinkExtractor(allow=r"/cat/"), follow=True, process_links="keep_links",
             process_request="mark_request"),
        Rule(LinkExtractor(allow=r"/item/"), callback="parse_item", cb_kwargs={"via": "rule"},
             process_request="mark_request"),
        Rule(LinkExtractor(allow=r"/gone/"), callback="parse_item", errback="on_gone"),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def keep_links(self, links: list[Any]) -> list[Any]:
        return [link for link in links if "skip" not in link.url]

    def mark_request(self, request: scrapy.Request, response: Any) -> scrapy.Request:
        return request.replace(meta={**request.meta, "from_cat": response.url.rsplit("/", 1)[1]})

    def parse_start_url(self, response: Any, **kwargs: Any) -> Any:
        yield {"kind": "home", "title": response.css("title::text").get()}

    def parse_item(self, response: Any, via: str = "") -> Any:
        yield {"kind": "item", "title": response.css("title::text").get(), "via": via,
               "from_cat": response.meta.get("from_cat")}

    def on_gone(self, failure: Any) -> Any:
        yield {"kind": "gone", "page": failure.request.url.rsplit("/", 1)[1]}


class KindsSitemapSpider(SitemapSpider):
    name = "kinds_sitemap"
    sitemap_rules = [("/item/", "parse_item")]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sitemap_urls = [kwargs["start_url"]]

    def parse_item(self, response: Any) -> Any:
        yield {"kind": "item", "title": response.css("title::text").get()}


class KindsXmlFeedSpider(XMLFeedSpider):
    name = "kinds_xmlfeed"
    iterator = "iternodes"
    itertag = "item"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse_node(self, response: Any, selector: Any) -> Any:
        return {"title": selector.xpath("title/text()").get(),
                "link": selector.xpath("link/text()").get()}


class KindsCsvFeedSpider(CSVFeedSpider):
    name = "kinds_csvfeed"
    headers = ["id", "name"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse_row(self, response: Any, row: dict[str, str]) -> Any:
        return dict(row)


class KindsAsyncSpider(scrapy.Spider):
    """Async-generator callbacks, several keyless items per page, and requests of several
    classes."""

    name = "kinds_async"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    async def parse(self, response: Any) -> AsyncIterator[Any]:
        for href in response.css("a::attr(href)").getall():
            if "/cat/" in href:
                yield response.follow(href, callback=self.parse_cat)
        yield scrapy.FormRequest(response.urljoin("/form"), formdata={"q": "naïve"},
                                 callback=self.parse_form, flags=["form"])

    async def parse_cat(self, response: Any) -> AsyncIterator[Any]:
        for title in response.css("a::text").getall():  # keyless, several per response
            yield {"cat": response.url.rsplit("/", 1)[1], "link": title}

    def parse_form(self, response: Any) -> Iterable[Any]:
        yield {"form": response.text, "class": type(response.request).__name__,
               "flags": response.request.flags}


class KindsJunkSpider(scrapy.Spider):
    """Yields things that are not items (stock Scrapy passes them on to item_scraped)."""

    name = "kinds_junk"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse(self, response: Any) -> Any:
        yield "a string"
        yield object()
        yield {"title": response.css("title::text").get()}


class KindsDataSpider(scrapy.Spider):
    """Yields a data: request (fetched by Scrapy's data: download handler, no network)."""

    name = "kinds_data"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse(self, response: Any) -> Any:
        yield scrapy.Request("data:text/plain;charset=utf-8,hello%20data%20%C3%A9",
                             callback=self.parse_data)

    def parse_data(self, response: Any) -> Any:
        yield {"text": response.text, "scheme": response.url.split(":", 1)[0]}


class KindsCookiesSpider(scrapy.Spider):
    """Requests with their own cookies (both forms), after a page that sets one in the jar."""

    name = "kinds_cookies"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [kwargs["start_url"] + "cookies/set"]

    def parse(self, response: Any) -> Any:
        yield {"page": "set", **response.json()}
        yield response.follow("/cookies/dict", callback=self.parse_echo,
                              cookies={"sid": "42", "lang": "fr"})

    def parse_echo(self, response: Any) -> Any:
        page = response.url.rsplit("/", 1)[1]
        yield {"page": page, **response.json()}
        if page == "dict":  # one after the other: the jar's content is then deterministic
            yield response.follow("/cookies/list", callback=self.parse_echo,
                                  cookies=[{"name": "tok", "value": "x", "path": "/cookies"}])


class KindsPageMethodSpider(scrapy.Spider):
    """scrapy-playwright's PageMethods in a yielded request's meta (no browser: the callback
    shows what the worker rebuilt)."""

    name = "kinds_pagemethod"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse(self, response: Any) -> Any:
        from scrapy_playwright.page import PageMethod

        yield response.follow("/item/1-0", callback=self.parse_item, meta={
            "playwright_page_methods": [PageMethod("wait_for_selector", "title", timeout=500)]})

    def parse_item(self, response: Any) -> Any:
        [method] = response.meta["playwright_page_methods"]
        yield {"type": type(method).__name__, "method": method.method, "args": list(method.args),
               "kwargs": method.kwargs}


class KindsOffsiteSpider(scrapy.Spider):
    """``allowed_domains``: a request the home page yields to another host is dropped by
    Scrapy's OffsiteMiddleware, unless its meta says ``allow_offsite``; a request on the site
    goes."""

    name = "kinds_offsite"
    allowed_domains = ["127.0.0.1"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse(self, response: Any) -> Any:
        url = urlsplit(response.url)
        yield {"host": url.hostname, "path": url.path}
        if url.path == "/":
            other = response.url.replace("//127.0.0.1:", "//localhost:")
            yield scrapy.Request(other + "cat/1")
            yield scrapy.Request(other + "cat/2", meta={"allow_offsite": True})
            yield response.follow("/item/1-0")


class KindsStatusSpider(scrapy.Spider):
    """Statuses the spider asks for (``handle_httpstatus_list``), a redirect it keeps
    (``dont_redirect``) and one Scrapy follows; a 404 it did not ask for is dropped."""

    name = "kinds_status"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse(self, response: Any) -> Any:
        yield response.follow("/gone/1", self.parse_status, meta={"handle_httpstatus_list": [404]})
        yield response.follow("/gone/2", self.parse_status)
        yield response.follow("/moved?kept", self.parse_status,
                              meta={"dont_redirect": True, "handle_httpstatus_list": [302]})
        yield response.follow("/moved?followed", self.parse_status)

    def parse_status(self, response: Any) -> Any:
        yield {"page": response.url.split("/", 3)[3], "status": response.status,
               "location": response.headers.get("Location", b"").decode()}


class Seller(scrapy.Item):
    name = scrapy.Field()
    rating = scrapy.Field()


class KindsValuesSpider(scrapy.Spider):
    """Item values beyond JSON's types, as spiders yield them: a price-parser amount (a
    ``Decimal``), a set, a nested item."""

    name = "kinds_values"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse(self, response: Any) -> Any:
        price = Price.fromstring("1 299,00 €")
        yield {"title": response.css("title::text").get(), "price": price.amount,
               "currency": price.currency, "tags": {"sale"},
               "seller": Seller(name="shop", rating=Decimal("4.80"))}


class Listing(scrapy.Item):
    home = scrapy.Field()
    category = scrapy.Field()
    fee = scrapy.Field()
    total = scrapy.Field()
    seller = scrapy.Field()


class KindsChainSpider(scrapy.Spider):
    """An item begun on one page and finished on the next (Scrapy's docs' pattern): passed on
    in ``cb_kwargs``, with a ``Decimal`` in ``meta``; each next page is another task."""

    name = "kinds_chain"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse(self, response: Any) -> Any:
        for n, href in enumerate(response.css("a::attr(href)").getall()):
            if "/cat/" in href:
                listing = Listing(home=response.css("title::text").get(), fee=Decimal("1.10"),
                                  seller=Seller(name="shop", rating=Decimal(n)))
                yield response.follow(href, self.parse_category, cb_kwargs={"listing": listing},
                                      meta={"extra": Decimal("0.05")})

    def parse_category(self, response: Any, listing: Listing) -> Any:
        listing["category"] = response.css("title::text").get()
        listing["total"] = listing["fee"] + response.meta["extra"]  # (Decimals both)
        yield listing


class KindsFlakySpider(scrapy.Spider):
    """Three keyless items, then an error that may pass (a connection error, not a bug in the
    spider): the task fails and is delivered again and again."""

    name = "kinds_flaky"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _start(self, kwargs)

    def parse(self, response: Any) -> Any:
        task = response.meta.get("meteorseed_task")
        for n in range(3):
            yield {"n": n, "delivery_of": task.task_id if task else None}
        raise ConnectionError("fails after its items")

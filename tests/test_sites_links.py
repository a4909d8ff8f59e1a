"""Link following with Scrapy's LinkExtractor semantics: regions, files, nofollow, canonical."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request
from scrapy.http import HtmlResponse, TextResponse
from scrapy.linkextractors import IGNORED_EXTENSIONS, LinkExtractor

from meteorseed_scrapy.sites.links import follow, links
from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.rulefile import FileResult
from meteorseed_scrapy.sites.schema import parse_site
from meteorseed_scrapy.sites.spider import RuleSpider

URL = "http://shop.example/list/1"
PAGE = """<html><head><title>t</title></head><body>
<div class="list">
  <a href="/p/1">one</a>
  <a href=" /p/2?b=2&amp;a=1#reviews
  ">two</a>
  <a href="/p/3" rel="nofollow ugc">three</a>
  <a href="/files/brochure.PDF">pdf</a>
  <a href="/img/photo.jpg">jpg</a>
  <a href="/p/4?download=x.pdf">query</a>
  <a href="mailto:shop@shop.example">mail</a>
  <a href="javascript:go('/p/9')">js</a>
  <a href="/caf\u00e9/5">accent</a>
  <a href="http://elsewhere.example/p/6">off</a>
  <a href="/login?next=/p/7">login</a>
  <a href="/p/1#top">again</a>
  <area href="/p/8">
</div>
<a class="next" href="/list/2">next</a>
</body></html>"""


def config(**overrides: Any) -> Any:
    data: dict[str, Any] = {"site_id": "shop", "version": 1, "allowed_domains": ["shop.example"],
                            "blacklist": ["/login"], "list": {"links": "div.list"},
                            "fields": {"title": "h1::text"}}
    data.update(overrides)
    return parse_site(data, "shop.yaml")


def page(body: str = PAGE, url: str = URL) -> HtmlResponse:
    return HtmlResponse(url, body=body.encode("utf-8"), encoding="utf-8")


def followed(site: Any, response: HtmlResponse, rule: Any = None) -> list[str]:
    return follow(site, response.selector, rule or site.list_links, response)


def test_region_rules_are_scrapys_link_extractor() -> None:
    """A rule matching elements follows what LinkExtractor(restrict_css=...) extracts."""
    response = page()
    site = config(follow={"canonicalize": False})
    scrapy_links = LinkExtractor(restrict_css="div.list", allow_domains=["shop.example"],
                                 deny="/login").extract_links(response)
    assert followed(site, response) == [link.url for link in scrapy_links]
    # the same links picked as attribute values: the same URLs
    by_value = config(follow={"canonicalize": False},
                      list={"links": "div.list a::attr(href), div.list area::attr(href)"})
    assert sorted(followed(by_value, response)) == sorted(link.url for link in scrapy_links)


def test_files_nofollow_and_canonical_urls() -> None:
    response = page()
    site = config()
    assert followed(site, response) == [
        "http://shop.example/p/1", "http://shop.example/p/2?a=1&b=2",
        "http://shop.example/p/3", "http://shop.example/p/4?download=x.pdf",
        "http://shop.example/caf%C3%A9/5", "http://shop.example/p/8"]
    reasons = {link.url: link.skipped for link in links(site, response.selector,
                                                         site.list_links, response)}
    assert reasons["http://shop.example/files/brochure.PDF"].startswith("a file extension")
    assert reasons["http://shop.example/img/photo.jpg"].startswith("a file extension")
    by_value = config(list={"links": "a::attr(href)"})
    assert {link.url: link.skipped for link in links(by_value, response.selector,
                                                     by_value.list_links, response)}[
        "mailto:shop@shop.example"] == "not an http(s) URL"  # (LinkExtractor drops it unsaid)
    assert reasons["http://elsewhere.example/p/6"].startswith("off the allowed domains")
    assert reasons["http://shop.example/login?next=%2Fp%2F7"].startswith("off the allowed")
    strict = config(follow={"skip_nofollow": True, "deny_extensions": []})
    urls = followed(strict, response)
    assert "http://shop.example/p/3" not in urls
    assert "http://shop.example/files/brochure.PDF" in urls
    assert {link.url: link.skipped for link in links(strict, response.selector,
                                                     strict.list_links, response)}[
        "http://shop.example/p/3"] == "rel=nofollow (follow.skip_nofollow)"
    assert "pdf" in IGNORED_EXTENSIONS and "jpg" in IGNORED_EXTENSIONS


def test_nofollow_is_read_from_the_element_of_an_attribute_value() -> None:
    site = config(list={"links": "a::attr(href)"}, follow={"skip_nofollow": True})
    assert "http://shop.example/p/3" not in followed(site, page())
    assert "http://shop.example/p/1" in followed(site, page())


def test_an_element_rule_no_longer_follows_its_markup() -> None:
    """Before, `a.next` (no ::attr) made the element's markup a URL: http://.../<a class=..."""
    site = config(list={"links": "div.list", "pagination": "a.next"})
    assert followed(site, page(), site.pagination) == ["http://shop.example/list/2"]
    site = config(list={"links": "div.list", "pagination": {"css": "a.next", "attr": "href"}})
    assert followed(site, page(), site.pagination) == ["http://shop.example/list/2"]


def test_base_href_and_regex_values() -> None:
    body = ('<html><head><base href="http://shop.example/deep/dir/"></head><body>'
            '<a href="p/1">x</a><span data-u="go:/p/2">y</span></body></html>')
    site = config(list={"links": "a::attr(href)"})
    assert followed(site, page(body)) == ["http://shop.example/deep/dir/p/1"]
    site = config(list={"links": {"css": "span::attr(data-u)", "regex": "go:(.*)"}})
    assert followed(site, page(body)) == ["http://shop.example/p/2"]


def test_json_links_by_path_and_jmespath() -> None:
    data = {"next": "/jobs?page=2", "jobs": [{"url": "/jobs/1"}, {"url": "/jobs/1.zip"},
                                             {"url": "https://shop.example/jobs/2"}]}
    response = TextResponse("http://shop.example/jobs", body=json.dumps(data).encode(),
                            encoding="utf-8")
    site = config(format="json", list={"links": {"jmespath": "jobs[*].url"},
                                       "pagination": "next"}, fields={"title": "title"})
    assert follow(site, data, site.list_links, response) == [  # type: ignore[arg-type]
        "http://shop.example/jobs/1", "https://shop.example/jobs/2"]
    assert follow(site, data, site.pagination, response) == [  # type: ignore[arg-type]
        "http://shop.example/jobs?page=2"]


def test_the_spider_requests_only_followed_links() -> None:
    site = config(list={"links": "div.list", "pagination": "a.next"})
    registry = SiteRegistry(None)
    registry.apply([FileResult("shop.yaml", (0, 0), config=site)])
    spider = RuleSpider(registry=registry, reload_interval=0)
    response = page()
    response = HtmlResponse(URL, body=response.body, encoding="utf-8",
                            request=Request(URL, meta={"site_id": "shop"}))
    requests = [r for r in spider.parse_list(response) if isinstance(r, Request)]
    assert [(r.url, r.callback.__name__) for r in requests] == [  # type: ignore[union-attr]
        *((url, "parse_detail") for url in followed(site, response)),
        ("http://shop.example/list/2", "parse_list")]


HREF = st.one_of(
    st.text(max_size=40),
    st.builds(lambda path, ext: f"/{path}.{ext}", st.text("abc/%é ", max_size=10),
              st.sampled_from([*IGNORED_EXTENSIONS[:10], "html", "PDF", ""])),
    st.sampled_from(["javascript:x()", "//elsewhere.example/a", "http://[::1", "http://a b/",
                     "#frag", "?q=1", "/login", "data:text/html,x", "\x00", "http://"]),
)


@given(st.lists(HREF, max_size=8), st.booleans())
def test_any_hrefs_give_only_followable_urls(hrefs: list[str], canonicalize: bool) -> None:
    anchors = "".join(f'<a href="{h.replace(chr(34), "&quot;")}">x</a>' for h in hrefs)
    response = page(f"<html><body><div class='list'>{anchors}</div></body></html>")
    site = config(follow={"canonicalize": canonicalize})
    for rule in (site.list_links, config(list={"links": "a::attr(href)"}).list_links):
        urls = followed(site, response, rule)
        assert len(urls) == len(set(urls))
        for url in urls:
            assert url.startswith("http://shop.example/") and site.allows(url)
            assert not any(url.lower().split("?")[0].endswith("." + e)
                           for e in IGNORED_EXTENSIONS)


@pytest.mark.parametrize("rule", ["count(//a)", "boolean(//a)"])
def test_xpath_numbers_are_no_links(rule: str) -> None:
    site = config(list={"links": {"xpath": rule}})
    assert followed(site, page()) == []

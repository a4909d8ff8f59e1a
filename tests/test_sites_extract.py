"""Rule selectors are evaluated as compiled XPath on the lxml tree: same values as parsel's."""

from __future__ import annotations

import pytest
from scrapy.http import HtmlResponse

from meteorseed_scrapy.sites.extract import find, select_values, serialise
from meteorseed_scrapy.sites.model import Selector
from meteorseed_scrapy.testing.demo_pages import article, product

PAGES = [article(3), product(7), b"<html><body><p>a<!-- c --><b>b</b></p>"
         b"<ul><li class='x y'>1</li><li>2</li></ul></body></html>"]
QUERIES = [
    ("css", "h1::text"), ("css", ".author::text"), ("css", "time::attr(datetime)"),
    ("css", ".body p"), ("css", "li.x::text"), ("css", "p *"), ("css", "::attr(class)"),
    ("css", "nothing.here"), ("xpath", "//li/text()"), ("xpath", "count(//li)"),
    ("xpath", "boolean(//li)"), ("xpath", "//p/comment()"), ("xpath", "//li[has-class('y')]"),
    ("xpath", "//*[re:test(@class, '^x')]/text()"), ("xpath", "//span/@class"),
    ("xpath", "string(//h1)"),
]


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize(("kind", "query"), QUERIES)
def test_find_matches_parsel(page: bytes, kind: str, query: str) -> None:
    response = HtmlResponse("http://127.0.0.1/p", body=page, encoding="utf-8")
    expected = (response.css(query) if kind == "css" else response.xpath(query)).getall()
    select = Selector(css=query) if kind == "css" else Selector(xpath=query)
    assert [serialise(v) for v in find(response.selector, select)] == expected
    # and below an element (list items), as parsel evaluates relative queries
    for element in response.css("body"):
        expected = (element.css(query) if kind == "css" else element.xpath(query)).getall()
        assert [serialise(v) for v in find(element.root, select)] == expected


def test_attr_and_text_nodes_as_scope() -> None:
    response = HtmlResponse("http://127.0.0.1/p", body=PAGES[2], encoding="utf-8")
    assert select_values(response.selector, Selector(css="li", attr="class"), "u") == ["x y"]
    text_nodes = find(response.selector, Selector(xpath="//li/text()"))
    assert find(text_nodes[0], Selector(css="b")) == []  # nothing below a text node
    assert select_values(response.selector, Selector(css="p"), "u", text=True) == ["a b"]

"""Rule selectors are evaluated as compiled XPath on the lxml tree: same values as parsel's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from parsel import Selector as Parsel
from scrapy.http import HtmlResponse

from meteorseed_scrapy.sites.extract import extract, find, select_values, serialise
from meteorseed_scrapy.sites.model import Selector
from meteorseed_scrapy.sites.schema import parse_site
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


JOBS: dict[str, Any] = {
    "jobs": [{"id": 1, "title": "Cook", "tags": ["a", "b"], "salary": {"min": 10}},
             {"id": 2, "title": "Baker", "tags": [], "salary": None},
             {"id": 3, "title": None, "tags": ["c"]}],
    "next": "/jobs?page=2", "count": 3, "empty": [], "flag": True,
}
JMESPATHS = ["jobs[*].title", "jobs[0].tags", "jobs[*].tags", "jobs[].tags[]", "next", "count",
             "missing", "empty", "flag", "jobs[?salary.min > `5`].id", "length(jobs)",
             "jobs[*].salary.min", "jobs[-1].id", "{a: next, b: count}"]


@pytest.mark.parametrize("query", JMESPATHS)
def test_jmespath_values_are_parsels(query: str) -> None:
    """`jmespath:` picks what parsel's Selector.jmespath picks (strings and numbers alike)."""
    expected = [sel.root for sel in Parsel(text=json.dumps(JOBS)).jmespath(query)]
    got = select_values(JOBS, Selector(jmespath=query), "u")
    assert got == [value for value in expected if value is not None]


def test_jmespath_fields_and_runtime_errors() -> None:
    config = parse_site({"site_id": "jobs", "version": 1, "format": "json",
                         "list": {"items": {"jmespath": "jobs[?title]"}},
                         "unique_key": "id",
                         "fields": {"id": {"jmespath": "id", "processors": ["int"]},
                                    "tags": {"jmespath": "tags", "many": True},
                                    "n": {"jmespath": "length(title)"}}}, "t.json")
    items = select_values(JOBS, config.list_items, "u")  # type: ignore[arg-type]
    assert [item["id"] for item in items] == [1, 2]
    parsed = extract(config.fields, items[0], "u")
    assert parsed.fields == {"id": 1, "tags": ["a", "b"], "n": 4} and parsed.problems == []
    parsed = extract(config.fields, {"id": 5, "title": 7}, "u")
    assert parsed.fields["n"] is None
    assert parsed.problems[0].startswith("n: jmespath: ")  # length() of a number

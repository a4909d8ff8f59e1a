"""url_template, keywords and sitemap seeds: expansion, limits, and sitemaps over real HTTP."""

from __future__ import annotations

import gzip
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.seeding.seed_lines import SeedLineError, parse_seed_line
from meteorseed_scrapy.seeding.seed_urls import PAYLOAD_FIELDS, UrlError, expand
from meteorseed_scrapy.seeding.templates import MAX_EXPANSION
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import TASK_TYPES


def seed(task_type: str, payload: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"seed_id": "s", "site_id": "site", "task_type": task_type,
                       "payload": payload, **extra})


def urls(line: str) -> list[str]:
    return [i.url for i in expand(parse_seed_line(line, 1)) if isinstance(i, ExecTask)]


def test_url_template_is_the_cartesian_product_of_int_and_date_ranges() -> None:
    line = seed("url_template", {
        "template": "https://s.example/{day}/list?page={page}",
        "params": {"page": {"start": 1, "stop": 5, "step": 2},
                   "day": {"start": "2024-01-30", "stop": "2024-02-02", "step_days": 2,
                           "format": "%Y/%m/%d"}},
    })
    assert urls(line) == [
        f"https://s.example/{d}/list?page={p}"
        for d in ("2024%2F01%2F30", "2024%2F02%2F01") for p in (1, 3, 5)
    ]


def test_url_template_beyond_the_limit_is_rejected_with_the_count() -> None:
    line = seed("url_template", {"template": "https://s.example/{a}/{b}", "params": {
        "a": {"start": 1, "stop": 2000}, "b": {"start": 1, "stop": 1000}}})
    limit = f"2000000 URLs, more than the limit of {MAX_EXPANSION}"
    with pytest.raises(SeedLineError, match=limit):
        parse_seed_line(line, 7)


@pytest.mark.parametrize(("payload", "reason"), [
    ({"template": "https://s.example/{x}", "params": {"y": {"start": 1, "stop": 2}}},
     "uses {x}, which params do not define"),
    ({"template": "https://s.example/{x}", "params": {"x": {"start": 1, "stop": 2, "step": 0}}},
     "step: must not be 0"),
    ({"template": "https://s.example/{d}", "params": {"d": {"start": "2024-13-01"}}},
     "YYYY-MM-DD"),
])
def test_url_template_errors_name_the_field(payload: dict[str, Any], reason: str) -> None:
    with pytest.raises(SeedLineError, match="payload") as info:
        parse_seed_line(seed("url_template", payload), 1)
    assert reason in info.value.reason


# A misspelt field is refused, naming it: ignored, each of these would quietly crawl more
# (a step of 1, a daily range, a whole sitemap) or other pages than the line says.
@pytest.mark.parametrize(("task_type", "payload", "field"), [
    ("url_list", {"urls": ["https://s.example/"], "url": "https://s.example/2"}, "payload.url"),
    ("url_template", {"template": "https://s.example/{p}", "params": {
        "p": {"start": 1, "stop": 90, "stpe": 10}}}, "payload.params.p.stpe"),
    ("url_template", {"template": "https://s.example/{d}", "params": {
        "d": {"start": "2024-01-01", "stop": "2024-12-31", "step": 7}}}, "payload.params.d.step"),
    ("url_template", {"template": "https://s.example/{p}", "params": {
        "p": {"values": [1, 2], "stop": 9}}}, "payload.params.p.stop"),
    ("url_template", {"template": "https://s.example/{p}", "params": {
        "p": {"start": 1, "stop": 2}}, "param": {}}, "payload.param"),
    ("keywords", {"search_template": "https://s.example/?q={keyword}", "keywords": ["a"],
                  "keyword": "b"}, "payload.keyword"),
    ("sitemap", {"url": "https://s.example/sitemap.xml", "lastmod_since": "2024-01-01"},
     "payload.lastmod_since"),
])
def test_a_payload_field_its_type_does_not_have_is_refused_by_name(
        task_type: str, payload: dict[str, Any], field: str) -> None:
    with pytest.raises(SeedLineError) as info:
        parse_seed_line(seed(task_type, payload), 3)
    assert info.value.reason.startswith(f"{field}: is not a field of "), info.value.reason


def test_every_seed_type_has_its_payload_fields_and_no_other_type_does() -> None:
    # Two tables on two floors (task/ knows the types, seeding/ their fields): one of them
    # changed alone would fail every seed of a new type with a KeyError, or name a dead one.
    assert set(PAYLOAD_FIELDS) == TASK_TYPES


@settings(max_examples=200, deadline=None)
@given(task_type=st.sampled_from(sorted(PAYLOAD_FIELDS)), extra=st.text(min_size=1, max_size=40),
       value=st.none() | st.integers() | st.text(max_size=10))
def test_any_unknown_payload_field_is_refused_and_named(task_type: str, extra: str,
                                                         value: Any) -> None:
    """Whatever the name (empty-looking, a control character, a near miss of a real one),
    a field outside its type's is the one the refusal names; the line is never taken."""
    assume(extra not in PAYLOAD_FIELDS[task_type])
    good = {"url_list": {"urls": ["https://s.example/"]},
            "url_template": {"template": "https://s.example/{p}",
                             "params": {"p": {"start": 1, "stop": 2}}},
            "keywords": {"search_template": "https://s.example/?q={keyword}",
                         "keywords": ["a"]},
            "sitemap": {"url": "https://s.example/sitemap.xml"}}[task_type]
    parse_seed_line(seed(task_type, good), 1)  # (the payload without it is taken)
    with pytest.raises(SeedLineError) as info:
        parse_seed_line(seed(task_type, {**good, extra: value}), 1)
    assert info.value.reason.startswith(f"payload.{extra}"[:200] + ": is not a field of a "
                                        f"{task_type} payload"), info.value.reason


def test_url_template_streams_a_large_range() -> None:
    line = seed("url_template", {"template": "https://s.example/p/{n}",
                                 "params": {"n": {"start": 1, "stop": MAX_EXPANSION}}})
    items = expand(parse_seed_line(line, 1))
    first = [next(items) for _ in range(3)]  # nothing is built ahead
    assert [t.url for t in first if isinstance(t, ExecTask)] == [
        "https://s.example/p/1", "https://s.example/p/2", "https://s.example/p/3"]


def test_keywords_are_url_encoded_and_a_bad_one_is_reported_by_position() -> None:
    line = seed("keywords", {"search_template": "https://s.example/search?q={keyword}",
                             "keywords": ["red shoes", "a&b=c/d", "", "ü"]},
                meta={"recrawl_after": 3600})
    items = list(expand(parse_seed_line(line, 1)))
    tasks = [i for i in items if isinstance(i, ExecTask)]
    assert [t.url for t in tasks] == [
        "https://s.example/search?q=red%20shoes", "https://s.example/search?q=a%26b%3Dc%2Fd",
        "https://s.example/search?q=%C3%BC"]
    assert [(e.position, "non-empty" in e.reason) for e in items if isinstance(e, UrlError)] == [
        (2, True)]
    assert tasks[0].meta["recrawl_after"] == 3600


# -- sitemaps over HTTP -------------------------------------------------------------------------

def loopback(site_id: str) -> FetchPolicy:
    """The test sites serve on 127.0.0.1: METEORSEED_FETCH_PRIVATE_ADDRESSES=True."""
    return FetchPolicy(private_addresses=True, site_id=site_id)


def urlset(locs: list[tuple[str, str]]) -> bytes:
    body = "".join(f"<url><loc>{u}</loc>" + (f"<lastmod>{m}</lastmod>" if m else "") + "</url>"
                   for u, m in locs)
    return (f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"{body}</urlset>").encode()


@pytest.fixture
def sitemap_server() -> Iterator[tuple[str, dict[str, bytes]]]:
    pages: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pages
    finally:
        server.shutdown()
        server.server_close()


def test_sitemap_index_gzip_lastmod_filter_and_a_failing_child(
    sitemap_server: tuple[str, dict[str, bytes]]
) -> None:
    base, pages = sitemap_server
    pages["/a.xml"] = urlset([(f"{base}/p/1", "2024-02-01"), (f"{base}/p/2", "2023-12-31"),
                              (f"{base}/p/3", "")])
    pages["/b.xml.gz"] = gzip.compress(urlset([(f"{base}/p/4", "2024-03-01T10:00:00+00:00")]))
    pages["/index.xml"] = (
        '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<sitemap><loc>{base}/a.xml</loc></sitemap><sitemap><loc>{base}/gone.xml</loc>"
        f"</sitemap><sitemap><loc>{base}/b.xml.gz</loc></sitemap></sitemapindex>").encode()
    line = seed("sitemap", {"url": f"{base}/index.xml", "lastmod_after": "2024-01-01"})
    items = list(expand(parse_seed_line(line, 1), loopback))
    assert [i.url for i in items if isinstance(i, ExecTask)] == [
        f"{base}/p/1", f"{base}/p/3", f"{base}/p/4"]
    [error] = [i for i in items if isinstance(i, UrlError)]
    assert "gone.xml: HTTP 404" in error.reason


def test_sitemap_refuses_doctype_and_reports_an_unreachable_root(
    sitemap_server: tuple[str, dict[str, bytes]]
) -> None:
    from meteorseed_scrapy.seeding.sitemap import SitemapError

    base, pages = sitemap_server
    pages["/bomb.xml"] = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><urlset/>'
    with pytest.raises(SitemapError, match="DOCTYPE"):
        list(expand(parse_seed_line(seed("sitemap", {"url": f"{base}/bomb.xml"}), 1), loopback))
    with pytest.raises(SitemapError, match="HTTP 404"):
        list(expand(parse_seed_line(seed("sitemap", {"url": f"{base}/none.xml"}), 1), loopback))

"""``meteorseed sites check | try | schema``: rule files tried without a fleet (no Redis)."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from meteorseed_scrapy import cli
from meteorseed_scrapy.cli import main
from meteorseed_scrapy.sites.schema import rule_schema
from meteorseed_scrapy.testing.demo_pages import article, product

EXAMPLES = Path(__file__).resolve().parents[1] / "example_project" / "sites"


@pytest.fixture(autouse=True)
def no_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """These commands never connect: any attempt fails the test."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a files-only command tried to connect to Redis")

    monkeypatch.setattr(cli, "connect", refuse)
    monkeypatch.setattr(cli, "resolve_target", refuse)
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                 "ALL_PROXY", "METEORSEED_SITES_DIR"):
        monkeypatch.delenv(name, raising=False)


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["sites", *argv], stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_check_passes_the_examples() -> None:
    code, out, _ = run("check", str(EXAMPLES))
    assert code == 0 and out.splitlines()[-1] == "4 valid, 0 invalid"
    code, out, _ = run("check", str(EXAMPLES / "news.yaml"), "--json")
    assert code == 0 and json.loads(out) == {
        "valid": {"example_news": str(EXAMPLES / "news.yaml")}, "errors": []}


def test_check_names_each_bad_file_and_field(tmp_path: Path) -> None:
    good = (EXAMPLES / "news.yaml").read_text()
    (tmp_path / "a_news.yaml").write_text(good)
    (tmp_path / "b_typo.yaml").write_text(good.replace("site_id: example_news",
                                                       "site_id: typo\npagnation: x"))
    (tmp_path / "c_twice.yaml").write_text(good)
    (tmp_path / "d_price.yaml").write_text(good.replace("site_id: example_news",
                                                        "site_id: d").replace(
        "processors: [int]", "processors: [{price: {part: cents}}]"))
    (tmp_path / "e_broken.json").write_text("{")
    (tmp_path / "notes.txt").write_text("not a rule file")
    code, out, _ = run("check", str(tmp_path))
    lines = out.splitlines()
    assert code == 1 and lines[-1] == "1 valid, 4 invalid"
    assert f"{tmp_path / 'b_typo.yaml'}: pagnation: unknown key" in lines
    assert f"{tmp_path / 'c_twice.yaml'}: site_id: 'example_news' is already defined in" \
           f" {tmp_path / 'a_news.yaml'}" in lines
    assert f"{tmp_path / 'd_price.yaml'}: fields.article_id.processors[0].price.part: must be" \
           " one of both, amount, currency, got 'cents'" in lines
    assert any(line.startswith(f"{tmp_path / 'e_broken.json'}: <top>: not valid JSON")
               for line in lines)
    code, out, _ = run("check", str(tmp_path), "--json")
    errors = json.loads(out)["errors"]
    assert code == 1 and {(e["source"].rsplit("/", 1)[-1], e["path"]) for e in errors} == {
        ("b_typo.yaml", "pagnation"), ("c_twice.yaml", "site_id"),
        ("d_price.yaml", "fields.article_id.processors[0].price.part"), ("e_broken.json", "")}
    assert run("check", str(tmp_path / "missing"))[0] == 1
    assert run("check", str(tmp_path / "notes.txt"))[0] == 1


def test_schema_prints_the_validators_schema() -> None:
    code, out, _ = run("schema")
    assert code == 0 and json.loads(out) == rule_schema()


def test_try_a_saved_page(tmp_path: Path) -> None:
    saved = tmp_path / "article.html"
    saved.write_bytes(article(3))
    code, out, err = run("try", "example_news", str(saved), "--sites-dir", str(EXAMPLES),
                         "--url", "http://127.0.0.1:8000/news/article/3",
                         "--callback", "parse_detail")
    assert code == 0, err
    assert "item 1 of 1 (unique_key 3)" in out
    assert "  published = '2024-01-03T23:00:00Z'\n" in out and "raw 'January 04, 2024'" in out
    code, out, _ = run("try", "example_news", str(saved), "--sites-dir", str(EXAMPLES),
                       "--url", "http://127.0.0.1:8000/news/article/3", "--callback",
                       "parse_detail", "--json")
    result = json.loads(out)
    item = result["items"][0]
    assert item["fields"]["article_id"] == 3 and item["raw"]["article_id"] == "3"
    assert item["anomalies"] == [] and result["follow"] == []


class Shop(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        Shop.seen.append(dict(self.headers.items()))
        if self.path == "/shop/category/1":
            body = (b'<html><body><a class="product" href="/shop/product/7">p</a>'
                    b'<a class="product" href="/shop/manual.pdf">m</a>'
                    b'<a class="product" href="http://elsewhere.example/x">x</a>'
                    b'<a class="next" href="/shop/category/1?page=2#top">next</a></body></html>'
                    )
        elif self.path == "/shop/product/7":
            body = product(7)
        elif self.path == "/shop/product/8":
            body = product(8).replace(b'class="price"', b'class="cost"')
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def shop() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Shop)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_try_fetches_with_the_sites_headers_and_lists_links(shop: str) -> None:
    Shop.seen.clear()
    code, out, err = run("try", "example_shop", f"{shop}/shop/category/1",
                         "--sites-dir", str(EXAMPLES), "--json")
    result = json.loads(out)
    assert code == 1 and result["items"] == []  # a list page of a site without list.items
    assert result["follow"] == [
        {"url": f"{shop}/shop/product/7", "callback": "parse_detail"},
        {"url": f"{shop}/shop/category/1?page=2", "callback": "parse_list"}]
    assert {(s["url"].rsplit("/", 1)[-1], s["reason"].split(" ")[0]) for s in result["skipped"]
            } == {("manual.pdf", "a"), ("x", "off")}
    assert Shop.seen[-1]["User-Agent"].startswith("Scrapy/")
    code, out, err = run("try", "example_shop", f"{shop}/shop/product/7", "--sites-dir",
                         str(EXAMPLES), "--callback", "parse_detail")
    assert code == 0, err
    assert "  price = " in out and "ANOMALY" not in out


def test_try_shows_anomalies_and_http_errors(shop: str, tmp_path: Path) -> None:
    rules = tmp_path / "shop.yaml"
    rules.write_text((EXAMPLES / "shop.yaml").read_text() + "headers: {X-Test: 'on'}\n"
                     "user_agents: ['TryBot/1.0']\n")
    code, out, _ = run("try", "example_shop", f"{shop}/shop/product/8", "--sites-dir",
                       str(tmp_path), "--callback", "parse_detail")
    assert code == 1 and "  ANOMALY price: required but empty" in out
    assert Shop.seen[-1]["User-Agent"] == "TryBot/1.0" and Shop.seen[-1]["X-Test"] == "on"
    code, _, err = run("try", "example_shop", f"{shop}/nothing", "--sites-dir", str(tmp_path))
    assert code == 1 and "HTTP 404" in err
    code, _, err = run("try", "nope", f"{shop}/nothing", "--sites-dir", str(tmp_path))
    assert code == 2 and "no valid rules for site 'nope' (valid: example_shop)" in err
    code, _, err = run("try", "example_shop", str(tmp_path / "absent.html"), "--sites-dir",
                       str(tmp_path))
    assert code == 2 and "cannot read" in err


def test_try_a_json_page_and_a_page_that_is_not_json(tmp_path: Path) -> None:
    page = tmp_path / "jobs.json"
    page.write_text(json.dumps({"jobs": [{"id": 1, "title": "Cook", "company": "C",
                                          "posted": "2024-01-02",
                                          "salary": {"min": "1,000", "max": 2000}}],
                                "next": "/api/jobs?page=2"}))
    code, out, err = run("try", "example_jobs", str(page), "--sites-dir", str(EXAMPLES),
                         "--url", "http://127.0.0.1:8000/api/jobs", "--json")
    result = json.loads(out)
    assert code == 0, err
    assert result["items"][0]["fields"]["salary_min"] == 1000
    assert result["follow"] == [{"url": "http://127.0.0.1:8000/api/jobs?page=2",
                                 "callback": "parse_list"}]
    page.write_text("<html>not json</html>")
    code, _, err = run("try", "example_jobs", str(page), "--sites-dir", str(EXAMPLES))
    assert code == 1 and "not parsed" in err


@pytest.mark.parametrize("depth", [2_000, 8_000, 100_000])
def test_try_a_json_page_nested_too_deep_names_the_field(tmp_path: Path, depth: int) -> None:
    """2,000 and 8,000 levels parse on Python 3.13 only, 100,000 nowhere: the same on all."""
    page = tmp_path / "jobs.json"
    page.write_text('{"jobs": [], "junk": ' + "[" * depth + "]" * depth + "}")
    code, out, err = run("try", "example_jobs", str(page), "--sites-dir", str(EXAMPLES),
                         "--url", "http://127.0.0.1:8000/api/jobs")
    path = "response.junk" + "[0]" * 511
    assert (code, out) == (1, "")
    assert err == (f"meteorseed: http://127.0.0.1:8000/api/jobs: not parsed: {path[:200]}…"
                   f"{path[-99:]}: nests deeper than 512 levels\n")


def test_try_a_saved_page_without_its_url_reads_it_as_a_page_of_the_site(tmp_path: Path) -> None:
    saved = tmp_path / "article 3.html"
    saved.write_bytes(article(3))
    code, out, err = run("try", "example_news", str(saved), "--sites-dir", str(EXAMPLES),
                         "--callback", "parse_detail")
    assert code == 0, err
    page = "https://127.0.0.1/article%203.html"  # its file name on the site's first domain
    assert f"{saved} read as {page}, a page of site example_news: pass --url" in err
    assert f"): {page}\n" in out and "item 1 of 1" in out
    assert "  published = '2024-01-03T23:00:00Z'\n" in out


def test_try_says_why_a_page_gives_no_item(tmp_path: Path) -> None:
    listing = tmp_path / "list.html"
    listing.write_bytes(b'<html><body><a class="article" href="/news/article/1">a</a>'
                        b'</body></html>')
    code, out, _ = run("try", "example_news", str(listing), "--sites-dir", str(EXAMPLES),
                       "--url", "http://127.0.0.1:8000/news/list/1")
    assert code == 1
    assert "\nno item: this page was parsed as a list page, and site example_news's list pages" \
           " carry none (no list.items rule; its items come from detail pages: --callback" \
           " parse_detail parses it as one)\n" in out
    code, out, _ = run("try", "example_news", str(listing), "--sites-dir", str(EXAMPLES),
                       "--url", "http://127.0.0.1:8000/news/list/1", "--json")
    assert code == 1 and json.loads(out)["no_item"].startswith("no item: this page was parsed")
    jobs = tmp_path / "jobs.json"
    jobs.write_text('{"results": []}')
    code, out, _ = run("try", "example_jobs", str(jobs), "--sites-dir", str(EXAMPLES),
                       "--url", "http://127.0.0.1:8000/jobs/api")
    assert code == 1 and "\nno item: list.items (" in out and ") matched nothing on this page" \
        in out


@pytest.mark.parametrize(("url", "why"), [
    ("http://elsewhere.example/news/article/3",
     "host 'elsewhere.example' is not in the allowed domains of site example_news"
     " (127.0.0.1, localhost)"),
    ("http://127.0.0.1:8000/news/article/3?print=1",
     "matches the blacklist pattern '\\\\?print=1' of site example_news"),
])
def test_try_says_why_a_page_off_the_site_is_not_parsed(tmp_path: Path, url: str,
                                                         why: str) -> None:
    saved = tmp_path / "article.html"
    saved.write_bytes(article(3))
    code, out, err = run("try", "example_news", str(saved), "--sites-dir", str(EXAMPLES),
                         "--url", url, "--callback", "parse_detail")
    assert code == 1 and out == ""
    assert err == f"meteorseed: {url}: not parsed: {why} (a worker refuses it too)\n"
    # A URL to fetch is refused before any request is sent.
    code, _, err = run("try", "example_news", url, "--sites-dir", str(EXAMPLES))
    assert code == 1 and f"{url}: not parsed: {why}" in err

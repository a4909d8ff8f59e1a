"""The demo site: page shapes, test endpoints, hit counter, CLI."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from meteorseed_scrapy.sites.render import DEFAULT_CHROMIUM, chromium_missing
from meteorseed_scrapy.testing.redis_server import free_port
from meteorseed_scrapy.testing.sites import DemoSite


@pytest.fixture(scope="module")
def site() -> Iterator[DemoSite]:
    with DemoSite(news_pages=3, shop_categories=2, jobs_pages=2, js_pages=2) as demo:
        yield demo


def get(site: DemoSite, path: str) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(site.url + path, timeout=10) as resp:
            return resp.status, dict(resp.headers.items()), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers.items()), err.read().decode()


def hrefs(page: str, cls: str) -> list[str]:
    return re.findall(rf'class="{cls}" href="([^"]+)"', page)


def test_news_list_links_articles_and_next_page(site: DemoSite) -> None:
    status, headers, page = get(site, "/news/list/1")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert hrefs(page, "article") == [f"/news/article/{i}" for i in range(1, 11)]
    assert 'class="next" rel="next" href="/news/list/2"' in page
    _, _, last = get(site, "/news/list/3")
    assert hrefs(last, "article")[-1] == "/news/article/30"
    assert 'class="next"' not in last
    assert get(site, "/news/list/4")[0] == 404
    assert get(site, "/news/list/0")[0] == 404


def test_news_article_is_deterministic(site: DemoSite) -> None:
    status, _, page = get(site, "/news/article/7")
    assert status == 200
    for needle in ('class="title"', 'class="author"', 'datetime="2024-01-08"', 'class="body"'):
        assert needle in page
    assert 500 < len(page) < 8000
    assert get(site, "/news/article/7")[2] == page
    with DemoSite(news_pages=3) as other:
        assert get(other, "/news/article/7")[2] == page
    assert get(site, "/news/article/31")[0] == 404


def test_shop_category_and_product(site: DemoSite) -> None:
    _, _, index = get(site, "/shop/")
    assert hrefs(index, "category") == ["/shop/category/1", "/shop/category/2"]
    _, _, category = get(site, "/shop/category/2")
    assert hrefs(category, "product") == [f"/shop/product/{i}" for i in range(11, 21)]
    status, _, product = get(site, "/shop/product/12")
    assert status == 200
    assert 'class="sku">SKU-000012<' in product
    assert re.search(r'class="name">\w+ \w+ \d+<', product)
    assert re.search(r'class="price">\d{1,3}(,\d{3})*\.\d{2}<', product)
    prices = [re.findall(r'class="price">([^<]+)<', get(site, f"/shop/product/{i}")[2])[0]
              for i in range(1, 21)]
    assert any("," in price for price in prices)  # thousands separators appear
    assert get(site, "/shop/product/21")[0] == 404


def test_jobs_api_is_json_with_next_page(site: DemoSite) -> None:
    status, headers, body = get(site, "/jobs/api?page=1")
    assert status == 200 and headers["Content-Type"] == "application/json"
    data = json.loads(body)
    assert data["page"] == 1 and data["pages"] == 2 and data["next"] == "/jobs/api?page=2"
    assert [job["id"] for job in data["jobs"]] == list(range(1, 11))
    assert {"title", "company", "location", "salary", "posted"} <= set(data["jobs"][0])
    assert json.loads(get(site, "/jobs/api?page=2")[2])["next"] is None
    assert get(site, "/jobs/api?page=3")[0] == 404
    assert get(site, "/jobs/api?page=x")[0] == 400


def test_js_quotes_exist_only_in_the_api_the_page_script_fetches(site: DemoSite) -> None:
    status, headers, page = get(site, "/js/quotes/2")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert 'class="quote"' not in page and 'fetch("/js/api/quotes?page=2")' in page
    status, _, body = get(site, "/js/api/quotes?page=2")
    data = json.loads(body)
    assert status == 200 and data["next"] is None and data["pages"] == 2
    assert [q["id"] for q in data["quotes"]] == list(range(11, 21))
    assert re.fullmatch(r"\d\d\.\d\d\.2024", data["quotes"][0]["added"])
    assert json.loads(get(site, "/js/api/quotes?page=1")[2])["next"] == "/js/quotes/2"
    assert get(site, "/js/quotes/3")[0] == 404 and get(site, "/js/api/quotes?page=x")[0] == 404


@pytest.mark.parametrize("code", [404, 410, 429, 500, 503])
def test_status_endpoint(site: DemoSite, code: int) -> None:
    status, headers, _ = get(site, f"/status/{code}?retry_after=7")
    assert status == code
    assert headers["Retry-After"] == "7"


def test_flaky_fails_n_times_per_key(site: DemoSite) -> None:
    assert [get(site, "/flaky/a/2")[0] for _ in range(4)] == [503, 503, 200, 200]
    assert [get(site, "/flaky/b/1?code=500")[0] for _ in range(2)] == [500, 200]
    site.reset()
    assert get(site, "/flaky/a/2")[0] == 503


def test_slow_waits(site: DemoSite) -> None:
    started = time.monotonic()
    status, _, page = get(site, "/slow/200")
    assert status == 200 and 'class="delay">200<' in page
    assert time.monotonic() - started >= 0.19


def test_links_form_a_cycle(site: DemoSite) -> None:
    _, _, page = get(site, "/links/3")
    assert hrefs(page, "link") == ["/links/3/1", "/links/3/2", "/links/3/3", "/links/3"]
    _, _, child = get(site, "/links/3/3")
    assert hrefs(child, "link") == ["/links/3", "/links/3/1"]
    assert get(site, "/links/3/4")[0] == 404


def test_redirect(site: DemoSite) -> None:
    conn = http.client.HTTPConnection(site.host, site.port, timeout=5)
    conn.request("GET", "/redirect?to=/news/article/1&code=301")
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.status == 301 and resp.getheader("Location") == "/news/article/1"


def test_hit_counter_in_process_and_over_http(site: DemoSite) -> None:
    site.reset()
    assert site.hits("/news/article/5") == 0
    get(site, "/news/article/5")
    get(site, "/news/article/5")
    get(site, "/jobs/api?page=2")
    assert site.hits("/news/article/5") == 2
    assert site.hits("/news/article/6") == 0
    assert site.hits("/jobs/api") == 1
    assert site.hits("/jobs/api?page=2") == 1
    assert site.hits("/jobs/api?page=1") == 0
    assert json.loads(get(site, "/count?path=/news/article/5")[2])["hits"] == 2
    everything = json.loads(get(site, "/count")[2])
    assert everything["total"] == 3 == site.total_hits()  # /count itself is not counted


def test_sections_and_loopback_only() -> None:
    with DemoSite(sections=["jobs"]) as jobs_only:
        assert get(jobs_only, "/jobs/api")[0] == 200
        assert get(jobs_only, "/news/list/1")[0] == 404
        assert get(jobs_only, "/count")[0] == 200
    with pytest.raises(ValueError, match="unknown sections"):
        DemoSite(sections=["nope"])
    with pytest.raises(ValueError, match="loopback"):
        DemoSite(host="0.0.0.0")


def test_serves_many_requests_quickly(site: DemoSite) -> None:
    def fetch(n: int) -> int:
        conn = http.client.HTTPConnection(site.host, site.port, timeout=10)  # keep-alive
        for i in range(n):
            conn.request("GET", f"/news/article/{i % 30 + 1}")
            conn.getresponse().read()
        conn.close()
        return n

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(fetch, [100] * 8))
    assert total / (time.monotonic() - started) > 300  # ~3000/s here; loose for slow CI


def test_command_line_serves_on_the_given_port() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "meteorseed_scrapy.testing.sites", "--port", str(port),
         "--sites", "news,test"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(f"serving http://127.0.0.1:{port}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status/200", timeout=5) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        proc.wait(10)


def test_demo_seeds_are_valid_seeds() -> None:
    from meteorseed_scrapy.task.seed_task import SeedTask
    from meteorseed_scrapy.testing.demo import demo_seeds

    seeds = [SeedTask.from_dict(seed) for seed in demo_seeds("http://127.0.0.1:1234/")]
    assert [seed.site_id for seed in seeds] == ["example_news", "example_shop", "example_jobs",
                                                "example_quotes"]
    assert all(url.startswith("http://127.0.0.1:1234/")
               for seed in seeds for url in seed.payload["urls"])
    without_js = demo_seeds("http://127.0.0.1:1234/", js=False)
    assert [seed["site_id"] for seed in without_js] == [s.site_id for s in seeds[:3]]


@pytest.mark.e2e
def test_make_demo_flow_stores_every_item() -> None:
    """``python -m meteorseed_scrapy.testing.demo --strict``: what ``make demo`` runs."""
    proc = subprocess.run(
        [sys.executable, "-m", "meteorseed_scrapy.testing.demo", "--strict", "--timeout", "240"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-4:-1] == [
        "site example_news: 50 items stored",
        "site example_shop: 30 items stored",
        "site example_jobs: 30 items stored",
    ]
    if chromium_missing(DEFAULT_CHROMIUM) is None:
        assert lines[-1] == "site example_quotes: 30 items stored"
    else:
        assert lines[-1].startswith("site example_quotes: 0 items stored (skipped: Chromium not")


@pytest.mark.e2e
def test_demo_without_chromium_skips_the_js_site_and_says_why() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "meteorseed_scrapy.testing.demo", "--strict", "--timeout", "240"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, METEORSEED_CHROMIUM_PATH="/nonexistent/chromium"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipping the JavaScript site example_quotes: Chromium not found at" \
        " /nonexistent/chromium" in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith(
        "site example_quotes: 0 items stored (skipped: Chromium not found at"
        " /nonexistent/chromium; install the Debian package `chromium`")

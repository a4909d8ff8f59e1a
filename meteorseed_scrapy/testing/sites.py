"""A small, deterministic demo site on loopback, for tests, the demo and benchmarks.

``with DemoSite() as site: site.url`` serves it from a daemon thread (``port=0``: a free port);
``python -m meteorseed_scrapy.testing.sites --port 8000`` serves it in the foreground. Sections
(``sections=`` / ``--sites``), told apart by path prefix:

* ``news``: ``/news/list/<page>`` (10 ``/news/article/<id>`` links, a "next" link); articles.
* ``shop``: ``/shop/`` → ``/shop/category/<n>`` (10 ``/shop/product/<id>`` links); products with
  name, price (``1,299.00``), currency and SKU.
* ``jobs``: ``/jobs/api?page=N``: JSON with 10 jobs and the path of the ``next`` page.
* ``js``: ``/js/quotes/<page>``: 10 quotes and a "next" link that only exist after the page's
  script ran (it fetches ``/js/api/quotes?page=N``); see :mod:`.demo_js`.
* ``test``: ``/slow/<ms>``, ``/status/<code>[?retry_after=S]``, ``/flaky/<key>/<n>[?code=C]`` (fails
  n times per key, then 200), ``/links/<n>`` (n children, all cycling back), ``/redirect?to=/path``.

Every request except ``/count`` is counted: ``site.hits("/news/article/3")`` in-process, or
``GET /count?path=/news/article/3`` from outside.
"""

from __future__ import annotations

import argparse
import html
import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import date, timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import parse_qs, urlsplit

from meteorseed_scrapy.testing import demo_js
from meteorseed_scrapy.testing.loopback import LoopbackHandler, LoopbackSite

SECTIONS = ("news", "shop", "jobs", "js", "test")
PER_PAGE = 10
MAX_SLOW_MS = 60_000
MAX_LINKS = 10_000

#: status, content type, body, extra headers
Reply = tuple[int, str, bytes, dict[str, str]]
Query = dict[str, list[str]]
HTML = "text/html; charset=utf-8"

_WORDS = (
    "market", "city", "river", "council", "report", "season", "energy", "garden", "school",
    "harbour", "festival", "bridge", "museum", "railway", "forest", "island", "valley", "station",
    "library", "weather", "village", "summit", "record", "project", "science", "music", "theatre",
    "budget", "airport", "history", "coast", "tower", "storm", "harvest", "quiet", "bright",
)
_FIRST = ("Ada", "Alan", "Grace", "Linus", "Margaret", "Ken", "Barbara", "Dennis", "Radia")
_LAST = ("Lovelace", "Turing", "Hopper", "Torvalds", "Hamilton", "Thompson", "Liskov", "Ritchie")
_ADJ = ("Compact", "Deluxe", "Classic", "Rugged", "Smart", "Silent", "Portable", "Vintage")
_NOUN = ("Kettle", "Lamp", "Backpack", "Drone", "Speaker", "Chair", "Tent", "Camera", "Bicycle")
_ROLES = ("Python Developer", "Data Engineer", "SRE", "QA Analyst", "Product Designer")
_CITIES = ("Berlin", "Lisbon", "Oslo", "Remote", "Madrid", "Vienna")


def _page(title: str, body: str) -> bytes:
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}'
            f"</title></head>\n<body>\n{body}\n</body></html>\n").encode()


def _html(title: str, body: str, status: int = 200, **headers: str) -> Reply:
    return status, HTML, _page(title, body), headers


def _listing(title: str, cls: str, items: Iterable[tuple[str, str]], extra: str = "") -> Reply:
    links = "\n".join(f'<li><a class="{cls}" href="{href}">{html.escape(text)}</a></li>'
                      for href, text in items)
    return _html(title, f"<h1>{html.escape(title)}</h1>\n<ul>\n{links}\n</ul>\n{extra}")


def _json(data: Any, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(data).encode(), {}


def _not_found() -> Reply:
    return _html("Not found", "<h1>404 Not found</h1>", 404)


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high))).capitalize()


@lru_cache(maxsize=2048)
def _article(aid: int) -> bytes:
    rng = random.Random(f"news-article-{aid}")
    title, author = _sentence(rng, 4, 8), f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
    day = date(2024, 1, 1) + timedelta(days=aid)
    paragraphs = "\n".join(
        "<p>" + ". ".join(_sentence(rng, 6, 14) for _ in range(4)) + ".</p>" for _ in range(4))
    return _page(title, (
        f'<article id="article-{aid}">\n<h1 class="title">{title}</h1>\n'
        f'<p class="byline">By <span class="author">{author}</span>, '
        f'<time class="date" datetime="{day.isoformat()}">{day:%B %d, %Y}</time></p>\n'
        f'<div class="body">\n{paragraphs}\n</div>\n</article>\n'
        '<p><a href="/news/list/1">Back to the news</a></p>'))


@lru_cache(maxsize=2048)
def _product(pid: int) -> bytes:
    rng = random.Random(f"shop-product-{pid}")
    name = f"{rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.randint(100, 999)}"
    price, category = rng.randint(499, 249_999) / 100, (pid - 1) // PER_PAGE + 1
    return _page(name, (
        f'<div class="product" id="product-{pid}">\n<h1 class="name">{name}</h1>\n'
        f'<p>Price: <span class="price">{price:,.2f}</span> <span class="currency">EUR</span></p>\n'
        f'<p>SKU: <span class="sku">SKU-{pid:06d}</span></p>\n'
        f'<p class="stock">{"In stock" if rng.random() < 0.8 else "Sold out"}</p>\n'
        f"<p>{_sentence(rng, 10, 20)}.</p>\n</div>\n"
        f'<p><a href="/shop/category/{category}">Back to category {category}</a></p>'))


def _job(jid: int) -> dict[str, Any]:
    rng = random.Random(f"jobs-{jid}")
    low = rng.randint(40, 90) * 1000
    return {
        "id": jid,
        "title": rng.choice(("Junior ", "", "Senior ", "Lead ")) + rng.choice(_ROLES),
        "company": f"{rng.choice(_LAST)} {rng.choice(('GmbH', 'Ltd', 'S.A.', 'AS'))}",
        "location": rng.choice(_CITIES),
        "salary": {"min": low, "max": low + rng.randint(5, 30) * 1000, "currency": "EUR"},
        "posted": (date(2024, 6, 1) + timedelta(days=jid % 90)).isoformat(),
    }


class DemoSite(LoopbackSite):
    """The demo site, served from a daemon thread while in a ``with`` block (or start/stop)."""

    thread_name = "demo-site"

    def __init__(self, port: int = 0, host: str = "127.0.0.1", *,
                 sections: Iterable[str] = SECTIONS, news_pages: int = 5,
                 shop_categories: int = 3, jobs_pages: int = 3, js_pages: int = 3) -> None:
        super().__init__(port, host)
        self.sections = frozenset(sections)
        if self.sections - set(SECTIONS):
            raise ValueError(f"unknown sections {sorted(self.sections - set(SECTIONS))}; "
                             f"known: {', '.join(SECTIONS)}")
        self.news_pages, self.shop_categories = news_pages, shop_categories
        self.jobs_pages, self.js_pages = jobs_pages, js_pages
        self._lock = threading.Lock()
        self._hits: Counter[str] = Counter()  # full target (path?query)
        self._path_hits: Counter[str] = Counter()  # path only
        self._flaky: Counter[str] = Counter()
        self._routes: list[tuple[str, re.Pattern[str], Callable[..., Reply]]] = [
            (section, re.compile(pattern), view) for section, pattern, view in (
                ("", r"/", self._index),
                ("", r"/robots\.txt", lambda q: (200, "text/plain", b"User-agent: *\n", {})),
                ("", r"/count", self._count),
                ("news", r"/news/?", lambda q: self._news_list(q, "1")),
                ("news", r"/news/list/(\d+)", self._news_list),
                ("news", r"/news/article/(\d+)", self._news_article),
                ("shop", r"/shop/?", self._shop_index),
                ("shop", r"/shop/category/(\d+)", self._shop_category),
                ("shop", r"/shop/product/(\d+)", self._shop_product),
                ("jobs", r"/jobs/api", self._jobs_api),
                ("js", r"/js/quotes/(\d+)", self._js_quotes),
                ("js", r"/js/api/quotes", self._js_api),
                ("test", r"/slow/(\d+)", self._slow),
                ("test", r"/status/(\d{3})", self._status),
                ("test", r"/flaky/([^/]+)/(\d+)", self._flaky_page),
                ("test", r"/links/(\d+)(?:/(\d+))?", self._links_page),
                ("test", r"/redirect", self._redirect),
            )]

    def hits(self, path: str) -> int:
        """Requests for ``path``: that exact target when it has a query, else with any query."""
        with self._lock:
            return self._hits[path] if "?" in path else self._path_hits[path]

    def total_hits(self) -> int:
        with self._lock:
            return sum(self._path_hits.values())

    def reset(self) -> None:
        """Forget the hit counts and the flaky counters."""
        with self._lock:
            self._hits.clear()
            self._path_hits.clear()
            self._flaky.clear()

    def handle(self, target: str) -> Reply:
        """The reply to ``GET target`` (a path with an optional query)."""
        parts = urlsplit(target)
        path = parts.path or "/"
        if path != "/count":
            with self._lock:
                self._hits[target] += 1
                self._path_hits[path] += 1
        for section, pattern, view in self._routes:
            match = pattern.fullmatch(path)
            if match and (not section or section in self.sections):
                return view(parse_qs(parts.query), *match.groups())
        return _not_found()

    def _index(self, q: Query) -> Reply:
        entries = {"news": ("/news/list/1", "News"), "shop": ("/shop/", "Shop"),
                   "jobs": ("/jobs/api?page=1", "Jobs API"), "js": ("/js/quotes/1", "Quotes"),
                   "test": ("/links/3", "Links")}
        shown = [entries[s] for s in SECTIONS if s in self.sections]
        return _listing("Demo site", "section", shown)

    def _count(self, q: Query) -> Reply:
        if "path" in q:
            return _json({"path": q["path"][0], "hits": self.hits(q["path"][0])})
        with self._lock:
            return _json({"hits": dict(self._hits), "total": sum(self._path_hits.values())})

    def _news_list(self, q: Query, page_s: str) -> Reply:
        page = int(page_s)
        if not 1 <= page <= self.news_pages:
            return _not_found()
        first = (page - 1) * PER_PAGE + 1
        nav = (f'<a class="next" rel="next" href="/news/list/{page + 1}">Next page</a>'
               if page < self.news_pages else '<span class="last">Last page</span>')
        return _listing(f"News, page {page} of {self.news_pages}", "article",
                        [(f"/news/article/{i}", f"Story {i}") for i in range(first, first + 10)],
                        f"<p>{nav}</p>")

    def _news_article(self, q: Query, aid_s: str) -> Reply:
        aid = int(aid_s)
        if not 1 <= aid <= self.news_pages * PER_PAGE:
            return _not_found()
        return 200, HTML, _article(aid), {}

    def _shop_index(self, q: Query) -> Reply:
        return _listing("Shop", "category", [(f"/shop/category/{n}", f"Category {n}")
                                             for n in range(1, self.shop_categories + 1)])

    def _shop_category(self, q: Query, n_s: str) -> Reply:
        n = int(n_s)
        if not 1 <= n <= self.shop_categories:
            return _not_found()
        first = (n - 1) * PER_PAGE + 1
        return _listing(f"Category {n}", "product",
                        [(f"/shop/product/{i}", f"Product {i}") for i in range(first, first + 10)])

    def _shop_product(self, q: Query, pid_s: str) -> Reply:
        pid = int(pid_s)
        if not 1 <= pid <= self.shop_categories * PER_PAGE:
            return _not_found()
        return 200, HTML, _product(pid), {}

    def _jobs_api(self, q: Query) -> Reply:
        raw = q.get("page", ["1"])[0]
        if not raw.isdigit():
            return _json({"error": "page must be a positive integer"}, 400)
        page = int(raw)
        if not 1 <= page <= self.jobs_pages:
            return _json({"error": f"no page {page}"}, 404)
        first = (page - 1) * PER_PAGE + 1
        return _json({"page": page, "pages": self.jobs_pages,
                      "next": f"/jobs/api?page={page + 1}" if page < self.jobs_pages else None,
                      "jobs": [_job(i) for i in range(first, first + PER_PAGE)]})

    def _js_quotes(self, q: Query, page_s: str) -> Reply:
        page = int(page_s)
        if not 1 <= page <= self.js_pages:
            return _not_found()
        return 200, HTML, demo_js.shell(page), {}

    def _js_api(self, q: Query) -> Reply:
        raw = q.get("page", ["1"])[0]
        if not raw.isdigit() or not 1 <= int(raw) <= self.js_pages:
            return _json({"error": f"no page {raw!r}"}, 404)
        return _json(demo_js.quotes_page(int(raw), self.js_pages))

    def _slow(self, q: Query, ms_s: str) -> Reply:
        ms = min(int(ms_s), MAX_SLOW_MS)
        time.sleep(ms / 1000)
        return _html(f"Slow {ms}", f'<h1>Slow page</h1>\n<p class="delay">{ms}</p>')

    def _status(self, q: Query, code_s: str) -> Reply:
        code = int(code_s)
        if not 200 <= code <= 599:
            return _html("Bad status", "<h1>status must be 200-599</h1>", 400)
        headers = {"Retry-After": q["retry_after"][0]} if "retry_after" in q else {}
        body = b"" if code in (204, 304) else _page(f"Status {code}", f"<h1>{code}</h1>")
        return code, HTML, body, headers

    def _flaky_page(self, q: Query, key: str, n_s: str) -> Reply:
        with self._lock:
            self._flaky[key] += 1
            seen = self._flaky[key]
        if seen <= int(n_s):
            code = int(q.get("code", ["503"])[0])
            return _html("Unavailable", f"<h1>{code}</h1>\n<p>attempt {seen}</p>", code)
        return _html("Flaky ok", f'<h1>OK</h1>\n<p class="attempt">{seen}</p>')

    def _links_page(self, q: Query, n_s: str, i_s: str | None) -> Reply:
        n = int(n_s)
        if not 0 <= n <= MAX_LINKS or (i_s is not None and not 1 <= int(i_s) <= n):
            return _not_found()
        if i_s is None:
            children = [(f"/links/{n}/{i}", f"Child {i}") for i in range(1, n + 1)]
            return _listing(f"Links {n}", "link", [*children, (f"/links/{n}", "This page")])
        i = int(i_s)
        return _listing(f"Link {i} of {n}", "link",
                        [(f"/links/{n}", "Parent"), (f"/links/{n}/{i % n + 1}", "Next sibling")])

    def _redirect(self, q: Query) -> Reply:
        to = q.get("to", ["/"])[0]
        if not to.startswith("/") or to.startswith("//"):
            return _html("Bad redirect", "<h1>to must be a local path</h1>", 400)
        return _html("Moved", f'<a href="{html.escape(to)}">moved</a>',
                     int(q.get("code", ["302"])[0]), Location=to)



class _Handler(LoopbackHandler):
    server_version = "MeteorSeedDemo/1.0"
    timeout = 30  # idle keep-alive connections are closed after this
    site: DemoSite

    def serve(self, head: bool = False) -> None:
        try:
            status, ctype, payload, headers = self.site.handle(self.path)
        except Exception as exc:  # a bug in a view answers 500 instead of dropping the line
            status, ctype, payload, headers = _html("Error", f"<pre>{exc!r}</pre>", 500)
        self.send_page(status, ctype, payload, headers, head)


DemoSite.handler = _Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the MeteorSeed demo site on loopback.")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument("--sites", default=",".join(SECTIONS),
                        help=f"comma-separated sections to serve (default: {','.join(SECTIONS)})")
    parser.add_argument("--news-pages", type=int, default=5)
    parser.add_argument("--shop-categories", type=int, default=3)
    parser.add_argument("--jobs-pages", type=int, default=3)
    parser.add_argument("--js-pages", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        site = DemoSite(args.port, args.host, news_pages=args.news_pages,
                        sections=[s.strip() for s in args.sites.split(",") if s.strip()],
                        shop_categories=args.shop_categories, jobs_pages=args.jobs_pages,
                        js_pages=args.js_pages)
    except ValueError as exc:
        parser.error(str(exc))
    with site:
        print(f"serving {site.url} ({', '.join(sorted(site.sections))}); Ctrl-C stops",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()

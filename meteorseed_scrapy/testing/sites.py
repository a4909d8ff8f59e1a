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
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from urllib.parse import parse_qs, urlsplit

from meteorseed_scrapy.testing import demo_js
from meteorseed_scrapy.testing.demo_pages import (
    HTML,
    PER_PAGE,
    Query,
    Reply,
    article,
    html_reply,
    job,
    json_reply,
    listing,
    not_found,
    page_html,
    product,
)
from meteorseed_scrapy.testing.loopback import (
    LoopbackHandler,
    LoopbackSite,
    serve_until_interrupted,
)

SECTIONS = ("news", "shop", "jobs", "js", "test")
MAX_SLOW_MS = 60_000
MAX_LINKS = 10_000

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
        return not_found()

    def _index(self, q: Query) -> Reply:
        entries = {"news": ("/news/list/1", "News"), "shop": ("/shop/", "Shop"),
                   "jobs": ("/jobs/api?page=1", "Jobs API"), "js": ("/js/quotes/1", "Quotes"),
                   "test": ("/links/3", "Links")}
        shown = [entries[s] for s in SECTIONS if s in self.sections]
        return listing("Demo site", "section", shown)

    def _count(self, q: Query) -> Reply:
        if "path" in q:
            return json_reply({"path": q["path"][0], "hits": self.hits(q["path"][0])})
        with self._lock:
            return json_reply({"hits": dict(self._hits), "total": sum(self._path_hits.values())})

    def _news_list(self, q: Query, page_s: str) -> Reply:
        page = int(page_s)
        if not 1 <= page <= self.news_pages:
            return not_found()
        first = (page - 1) * PER_PAGE + 1
        nav = (f'<a class="next" rel="next" href="/news/list/{page + 1}">Next page</a>'
               if page < self.news_pages else '<span class="last">Last page</span>')
        return listing(f"News, page {page} of {self.news_pages}", "article",
                        [(f"/news/article/{i}", f"Story {i}") for i in range(first, first + 10)],
                        f"<p>{nav}</p>")

    def _news_article(self, q: Query, aid_s: str) -> Reply:
        aid = int(aid_s)
        if not 1 <= aid <= self.news_pages * PER_PAGE:
            return not_found()
        return 200, HTML, article(aid), {}

    def _shop_index(self, q: Query) -> Reply:
        return listing("Shop", "category", [(f"/shop/category/{n}", f"Category {n}")
                                             for n in range(1, self.shop_categories + 1)])

    def _shop_category(self, q: Query, n_s: str) -> Reply:
        n = int(n_s)
        if not 1 <= n <= self.shop_categories:
            return not_found()
        first = (n - 1) * PER_PAGE + 1
        return listing(f"Category {n}", "product",
                        [(f"/shop/product/{i}", f"Product {i}") for i in range(first, first + 10)])

    def _shop_product(self, q: Query, pid_s: str) -> Reply:
        pid = int(pid_s)
        if not 1 <= pid <= self.shop_categories * PER_PAGE:
            return not_found()
        return 200, HTML, product(pid), {}

    def _jobs_api(self, q: Query) -> Reply:
        raw = q.get("page", ["1"])[0]
        if not raw.isdigit():
            return json_reply({"error": "page must be a positive integer"}, 400)
        page = int(raw)
        if not 1 <= page <= self.jobs_pages:
            return json_reply({"error": f"no page {page}"}, 404)
        first = (page - 1) * PER_PAGE + 1
        return json_reply({"page": page, "pages": self.jobs_pages,
                      "next": f"/jobs/api?page={page + 1}" if page < self.jobs_pages else None,
                      "jobs": [job(i) for i in range(first, first + PER_PAGE)]})

    def _js_quotes(self, q: Query, page_s: str) -> Reply:
        page = int(page_s)
        if not 1 <= page <= self.js_pages:
            return not_found()
        return 200, HTML, demo_js.shell(page), {}

    def _js_api(self, q: Query) -> Reply:
        raw = q.get("page", ["1"])[0]
        if not raw.isdigit() or not 1 <= int(raw) <= self.js_pages:
            return json_reply({"error": f"no page {raw!r}"}, 404)
        return json_reply(demo_js.quotes_page(int(raw), self.js_pages))

    def _slow(self, q: Query, ms_s: str) -> Reply:
        ms = min(int(ms_s), MAX_SLOW_MS)
        time.sleep(ms / 1000)
        return html_reply(f"Slow {ms}", f'<h1>Slow page</h1>\n<p class="delay">{ms}</p>')

    def _status(self, q: Query, code_s: str) -> Reply:
        code = int(code_s)
        if not 200 <= code <= 599:
            return html_reply("Bad status", "<h1>status must be 200-599</h1>", 400)
        headers = {"Retry-After": q["retry_after"][0]} if "retry_after" in q else {}
        body = b"" if code in (204, 304) else page_html(f"Status {code}", f"<h1>{code}</h1>")
        return code, HTML, body, headers

    def _flaky_page(self, q: Query, key: str, n_s: str) -> Reply:
        with self._lock:
            self._flaky[key] += 1
            seen = self._flaky[key]
        if seen <= int(n_s):
            code = int(q.get("code", ["503"])[0])
            return html_reply("Unavailable", f"<h1>{code}</h1>\n<p>attempt {seen}</p>", code)
        return html_reply("Flaky ok", f'<h1>OK</h1>\n<p class="attempt">{seen}</p>')

    def _links_page(self, q: Query, n_s: str, i_s: str | None) -> Reply:
        n = int(n_s)
        if not 0 <= n <= MAX_LINKS or (i_s is not None and not 1 <= int(i_s) <= n):
            return not_found()
        if i_s is None:
            children = [(f"/links/{n}/{i}", f"Child {i}") for i in range(1, n + 1)]
            return listing(f"Links {n}", "link", [*children, (f"/links/{n}", "This page")])
        i = int(i_s)
        return listing(f"Link {i} of {n}", "link",
                        [(f"/links/{n}", "Parent"), (f"/links/{n}/{i % n + 1}", "Next sibling")])

    def _redirect(self, q: Query) -> Reply:
        to = q.get("to", ["/"])[0]
        if not to.startswith("/") or to.startswith("//"):
            return html_reply("Bad redirect", "<h1>to must be a local path</h1>", 400)
        return html_reply("Moved", f'<a href="{html.escape(to)}">moved</a>',
                     int(q.get("code", ["302"])[0]), Location=to)


class _Handler(LoopbackHandler):
    server_version = "MeteorSeedDemo/1.0"
    timeout = 30  # idle keep-alive connections are closed after this
    site: DemoSite

    def serve(self, head: bool = False) -> None:
        try:
            status, ctype, payload, headers = self.site.handle(self.path)
        except Exception as exc:  # a bug in a view answers 500 instead of dropping the line
            status, ctype, payload, headers = html_reply("Error", f"<pre>{exc!r}</pre>", 500)
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
    serve_until_interrupted(site, lambda started: (
        f"serving {started.url} ({', '.join(sorted(started.sections))}); Ctrl-C stops"))


if __name__ == "__main__":
    main()

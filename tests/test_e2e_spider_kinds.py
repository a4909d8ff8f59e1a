"""Scrapy's spider classes work as tasks: each spider of tests/e2e_project/probe/spiders/kinds.py
runs as a MeteorSeed worker (its start requests and every request it yields go through the
stream) and as stock Scrapy (no add-on, a feed), on the same local site; the items are the
same set (issue 26 point 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.canonical import url_hash
from meteorseed_scrapy.testing.loopback import LoopbackHandler, LoopbackSite
from tests.e2e_helpers import PROJECT, REPO, foreign_tracebacks_removed, stored_docs
from tests.subprocess_env import python_path

pytestmark = pytest.mark.e2e

#: Fields the store adds to an item's own.
STORED = {"_id", "site_id", "url", "seed_id", "task_id", "updated_at", "first_seen_at"}


def page(title: str, links: list[str]) -> bytes:
    anchors = "".join(f'<a href="{href}">{href.rsplit("/", 1)[1]}</a>' for href in links)
    return f"<html><head><title>{title}</title></head><body>{anchors}</body></html>".encode()


class KindsSite(LoopbackSite):
    """Two categories of three items (and links a rule skips or that are gone), a sitemap, an
    XML and a CSV feed, a form endpoint, and ``/cookies`` echoing the Cookie header. Records
    each request's path and headers."""

    thread_name = "kinds-site"

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, dict[str, str]]] = []

    def pages(self) -> dict[str, tuple[str, bytes]]:
        html, xml = "text/html; charset=utf-8", "application/xml"
        out = {"/": (html, page("Home", ["/cat/1", "/cat/2", "/about"]))}
        for cat in (1, 2):
            other = 3 - cat
            out[f"/cat/{cat}"] = (html, page(f"Cat {cat}", [
                *(f"/item/{cat}-{k}" for k in range(3)), f"/cat/{other}", f"/cat/skip{cat}",
                f"/gone/{cat}"]))
            for k in range(3):
                out[f"/item/{cat}-{k}"] = (html, page(f"Item {cat}-{k}", ["/"]))
        out["/cat/skip1"] = out["/cat/skip2"] = (html, page("Skipped", ["/item/9-9"]))
        out["/item/9-9"] = (html, page("Never reached", []))
        locs = "".join(f"<url><loc>{self.url}/item/{c}-{k}</loc></url>"
                       for c in (1, 2) for k in range(3))
        out["/sitemap.xml"] = (xml, (
            '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"{locs}</urlset>").encode())
        items = "".join(f"<item><title>Entry {i}</title><link>{self.url}/item/1-{i % 3}</link>"
                        "</item>" for i in range(5))
        out["/feed.xml"] = (xml, f'<?xml version="1.0"?><rss><channel>{items}</channel></rss>'
                            .encode())
        out["/feed.csv"] = ("text/csv", "".join(f"{i},name {i}\n" for i in range(6)).encode())
        return out

    class handler(LoopbackHandler):
        site: KindsSite

        def serve(self, head: bool = False, body: bytes = b"") -> None:
            site = self.site
            site.requests.append((self.path, dict(self.headers.items())))
            if self.path == "/form":
                self.send_page(200, "text/plain", body or b"(no body)", {}, head)
            elif self.path.startswith("/cookies"):
                echo = json.dumps({"cookie": self.headers.get("Cookie")}).encode()
                set_cookie = {"Set-Cookie": "jar=from-site; Path=/"} if "set" in self.path \
                    else {}
                self.send_page(200, "application/json", echo, set_cookie, head)
            elif self.path.startswith("/moved"):
                self.send_page(302, "text/plain", b"moved", {"Location": "/item/2-1"}, head)
            elif self.path in site.pages():
                ctype, payload = site.pages()[self.path]
                self.send_page(200, ctype, payload, {}, head)
            else:
                self.send_page(404, "text/plain", b"gone", {}, head)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.serve(body=self.rfile.read(length))


@pytest.fixture(scope="module")
def site() -> Any:
    with KindsSite() as served:
        yield served


def crawl(tmp_path: Path, spider: str, args: dict[str, str], settings: dict[str, Any],
          name: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "scrapy.cmdline", "crawl", spider,
           "-s", f"LOG_FILE={tmp_path / name}.log"]
    for key, value in args.items():
        cmd += ["-a", f"{key}={value}"]
    for key, value in settings.items():
        cmd += ["-s", f"{key}={value}"]
    env = dict(os.environ, PYTHONPATH=python_path(REPO, PROJECT))
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return subprocess.run(cmd, cwd=PROJECT, env=env, capture_output=True, text=True,
                          timeout=180)


def as_worker(tmp_path: Path, spider: str, args: dict[str, str], redis_url: str,
              namespace: str, **settings: Any) -> list[dict[str, Any]]:
    store = tmp_path / "items.db"
    proc = crawl(tmp_path, spider, args, {
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_STORE_URI": f"sqlite:///{store}", "METEORSEED_IDLE_CLOSE": 2,
        **settings}, "worker")
    log = (tmp_path / "worker.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    assert "Cannot make a task" not in log, log[-3000:]
    if spider != "kinds_flaky":
        assert "Traceback" not in foreign_tracebacks_removed(log), log[-3000:]
    return [{k: v for k, v in doc.items() if k not in STORED}
            for doc in stored_docs(store).values()]


def as_stock(tmp_path: Path, spider: str, args: dict[str, str],
             **settings: Any) -> list[dict[str, Any]]:
    feed = tmp_path / "stock.jsonl"
    proc = crawl(tmp_path, spider, args, {"ADDONS": "{}", "FEEDS": json.dumps(
        {str(feed): {"format": "jsonlines"}}), **settings}, "stock")
    assert proc.returncode == 0, (tmp_path / "stock.log").read_text()[-3000:]
    return [json.loads(line) for line in feed.read_text().splitlines()]


def same_items(worker: list[dict[str, Any]], stock: list[dict[str, Any]]) -> None:
    def key(items: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(item, sort_keys=True) for item in items)

    assert stock and key(worker) == key(stock)


@pytest.mark.parametrize(("spider", "start", "expected"), [
    # home + 6 items (cb_kwargs from the rule) + 2 gone pages (the rule's errback)
    ("kinds_crawl", "/", 9),
    ("kinds_sitemap", "/sitemap.xml", 6),
    ("kinds_xmlfeed", "/feed.xml", 5),
    ("kinds_csvfeed", "/feed.csv", 6),
    # 2 categories x 6 keyless items (links) each + the form's answer
    ("kinds_async", "/", 13),
    # a str and an object() yielded: logged, not stored, the task not failed
    ("kinds_junk", "/", 1),
    # a data: request, fetched by Scrapy's data: handler
    ("kinds_data", "/", 1),
    # cookies given on requests (both forms) reach the site, with the jar's
    ("kinds_cookies", "/", 3),
    # scrapy-playwright's PageMethod in meta, rebuilt on the worker
    ("kinds_pagemethod", "/", 1),
    # allowed_domains: the home page, an item, and the one other-host page allow_offsite lets go
    ("kinds_offsite", "/", 3),
    # a 404 and a 302 the spider asked for, a redirect followed (a 404 not asked for: dropped)
    ("kinds_status", "/", 3),
    # a Decimal, a set and a nested item, stored as Scrapy's JSON feed writes them
    ("kinds_values", "/", 1),
    # an item begun on one page and finished on the next, passed on in cb_kwargs
    ("kinds_chain", "/", 2),
])
def test_a_spider_class_gives_the_items_of_stock_scrapy(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        site: KindsSite, spider: str, start: str, expected: int) -> None:
    args = {"start_url": site.url + start}
    before = len(site.requests)
    worker = as_worker(tmp_path, spider, args, redis_url, namespace)
    by_worker = site.requests[before:]
    stock = as_stock(tmp_path, spider, args)
    same_items(worker, stock)
    assert len(worker) == expected
    keys = KeyLayout(namespace)
    assert sync_redis.xlen(keys.dead) == 0
    if spider == "kinds_crawl":
        assert not [p for p, _ in site.requests if "skip" in p]  # process_links ran
        assert all(item["from_cat"] in ("1", "2") for item in worker if item["kind"] == "item")
        # Scrapy's RefererMiddleware set each child's Referer where its parent was parsed; it
        # travels with the task to whichever worker fetches it
        referers = {path: headers.get("Referer") for path, headers in by_worker
                    if path.startswith("/item/")}
        assert len(referers) == 6 and all(
            (referer or "").startswith(f"{site.url}/cat/") for referer in referers.values())
    if spider == "kinds_cookies":
        cookie = {item["page"]: set((item["cookie"] or "").split("; ")) for item in worker}
        # the request's own and, one worker having fetched them all, the jar's (as stock)
        assert cookie["dict"] == {"sid=42", "lang=fr", "jar=from-site"}
        assert cookie["list"] >= {"tok=x", "jar=from-site"}
    if spider == "kinds_junk":
        assert (tmp_path / "worker.log").read_text().count("Not an item, not stored") == 2
    if spider == "kinds_offsite":
        assert {"host": "localhost", "path": "/cat/2"} in worker
        hosts = [headers.get("Host", "") for path, headers in site.requests if path == "/cat/1"]
        assert not [host for host in hosts if host.startswith("localhost")]  # neither fetched it
    if spider == "kinds_status":
        assert {"page": "moved?kept", "status": 302, "location": "/item/2-1"} in worker
        assert {"page": "item/2-1", "status": 200, "location": ""} in worker
    if spider == "kinds_values":
        assert worker[0]["price"] == "1299.00" and worker[0]["seller"]["rating"] == "4.80"
    if spider == "kinds_chain":
        assert {item["total"] for item in worker} == {"1.15"}
    if spider == "kinds_async":
        assert {"form": "q=na%C3%AFve", "class": "FormRequest", "flags": ["form"]} in worker


@pytest.mark.parametrize(("depth_limit", "expected"), [
    (1, 1),  # the home page; its categories (depth 1) are fetched, their items (2) are not
    (2, 9),  # as with no limit: nothing on this site is deeper
])
def test_a_depth_limit_holds_across_tasks_as_on_stock(
        tmp_path: Path, redis_url: str, namespace: str, site: KindsSite, depth_limit: int,
        expected: int) -> None:
    # (a request's depth travels in its task's meta: each child is another task, read by
    # whichever worker, and Scrapy's DepthMiddleware there counts on from its parent's)
    args = {"start_url": site.url + "/"}
    worker = as_worker(tmp_path, "kinds_crawl", args, redis_url, namespace,
                       DEPTH_LIMIT=depth_limit)
    stock = as_stock(tmp_path, "kinds_crawl", args, DEPTH_LIMIT=depth_limit)
    same_items(worker, stock)
    assert len(worker) == expected


def test_a_redelivered_task_upserts_the_same_keyless_documents(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        site: KindsSite) -> None:
    """Its callback yields three keyless items then fails with an error that may pass (a bug
    in the spider is dead-lettered at once instead): delivered three times, each
    delivery upserts the same three documents (keyed by position), never more."""
    url = f"{site.url}/item/2-2"
    worker = as_worker(tmp_path, "kinds_flaky", {"start_url": url}, redis_url, namespace,
                       METEORSEED_MAX_DELIVERIES=3, METEORSEED_CLAIM_IDLE=1)
    assert sorted(doc["n"] for doc in worker) == [0, 1, 2]
    docs = stored_docs(tmp_path / "items.db")
    digest = url_hash(url)
    assert set(docs) == {f"kinds_flaky:{digest}", f"kinds_flaky:{digest}-1",
                         f"kinds_flaky:{digest}-2"}
    [(_, dead)] = sync_redis.xrange(KeyLayout(namespace).dead)
    assert "fails after its items" in dead["reason"] and "delivered 4 times" in dead["reason"]

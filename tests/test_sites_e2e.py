"""`scrapy crawl sites` in example_project, as real worker processes, against the demo site."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import enqueue, stored_docs

from meteorseed_scrapy.queue.fleet.crawl_progress import read_progress_sync
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.subprocess_env import python_path

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "example_project"

LINKS_SITE = """# Added as a file only: no code knows about this site.
site_id: links_only
version: "2024-05"
list: {links: "a.link::attr(href)"}
fields:
  heading: {xpath: "//h1/text()", required: true}
  position: {css: "h1::text", regex: 'Link (\\d+) of', processors: [int]}
"""


def enqueue_details(redis_url: str, namespace: str, urls: list[str]) -> None:
    """Tasks for detail pages of example_news (a seed naming the ``parse_detail`` callback)."""
    enqueue(redis_url, namespace, urls, site_id="example_news", callback="parse_detail")


def start_sites_worker(tmp_path: Path, redis_url: str, namespace: str, sites_dir: Path,
                       idle_close: float = 2,
                       settings: dict[str, Any] | None = None) -> subprocess.Popen[bytes]:
    settings = {**(settings or {}),
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_STORE_URI": f"sqlite:///{tmp_path / 'items.db'}",
        "METEORSEED_IDLE_CLOSE": idle_close, "METEORSEED_SITES_DIR": str(sites_dir),
        "LOG_FILE": str(tmp_path / "worker.log"),
    }
    args = [sys.executable, "-m", "scrapy.cmdline", "crawl", "sites"]
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    env = dict(os.environ, PYTHONPATH=python_path(REPO))
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return subprocess.Popen(args, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def finish(proc: subprocess.Popen[bytes], tmp_path: Path, timeout: float = 120) -> str:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = -9
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert code == 0, log[-4000:]
    return log


def anomalies(store: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(store) as conn:
        return [json.loads(row[0]) for row in conn.execute("SELECT doc FROM anomalies")]


def no_task_left(sync_redis: Any, namespace: str) -> None:
    assert sync_redis.xlen(f"{namespace}:tasks") == 0
    assert sync_redis.xlen(f"{namespace}:dead") == 0


@pytest.fixture
def sites_dir(tmp_path: Path) -> Path:
    target = tmp_path / "sites"
    shutil.copytree(PROJECT / "sites", target)
    return target


def test_example_sites_and_a_file_only_site_crawl_end_to_end(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any, sites_dir: Path,
        demo_site: DemoSite) -> None:
    (sites_dir / "links.yaml").write_text(LINKS_SITE)
    base = demo_site.url
    enqueue(redis_url, namespace, [f"{base}/news/list/1"], site_id="example_news")
    enqueue(redis_url, namespace, [f"{base}/shop/"], site_id="example_shop")
    enqueue(redis_url, namespace, [f"{base}/jobs/api?page=1"], site_id="example_jobs")
    enqueue(redis_url, namespace, [f"{base}/links/3"], site_id="links_only")
    log = finish(start_sites_worker(tmp_path, redis_url, namespace, sites_dir), tmp_path)
    docs = stored_docs(tmp_path / "items.db")
    by_site: dict[str, list[dict[str, Any]]] = {}
    for doc in docs.values():
        by_site.setdefault(doc["site_id"], []).append(doc)
    assert {site: len(items) for site, items in by_site.items()} == {
        "example_news": 50, "example_shop": 30, "example_jobs": 30, "links_only": 3}
    news = docs["example_news:12"]
    assert news["rule_version"] == "1" and news["article_id"] == 12
    assert news["published"] == "2024-01-12T23:00:00Z"  # 13 January, Berlin time, in UTC
    assert news["author"] and len(news["body"]) > 50 and "Back to the news" not in news["body"]
    assert news["content_fingerprint"] and "duplicate_of" not in news
    product = docs["example_shop:SKU-000021"]
    assert isinstance(product["price"], float) and product["price_text"].replace(
        ",", "") == f"{product['price']:.2f}"
    assert product["category"] == 3
    assert docs["example_jobs:30"]["posted"].endswith("T00:00:00Z")
    links = sorted(doc["position"] for doc in by_site["links_only"])
    assert links == [1, 2, 3] and by_site["links_only"][0]["rule_version"] == "2024-05"
    assert anomalies(tmp_path / "items.db") == []
    assert "Sample of site example_news (rule version 1, 1 in 20)" in log
    # example_quotes (render: browser) is loaded but got no task: Playwright never started.
    assert "Loaded site example_quotes" in log
    assert "Starting download handler" not in log and "playwright/" not in log
    no_task_left(sync_redis, namespace)


def test_broken_selectors_fill_the_anomaly_store_and_tasks_are_acked(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any, sites_dir: Path,
        demo_site: DemoSite) -> None:
    news = sites_dir / "news.yaml"
    news.write_text(news.read_text().replace('"h1.title::text"', '"h1.headline::text"'))
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/list/1"], site_id="example_news")
    log = finish(start_sites_worker(tmp_path, redis_url, namespace, sites_dir), tmp_path)
    found = anomalies(tmp_path / "items.db")
    assert len(found) == 50  # 5 list pages of 10 articles, all broken the same way
    assert all(doc["reasons"] == ["title: required but empty"] for doc in found)
    assert all(doc["rule_version"] == "1" and doc["fields"]["author"] for doc in found)
    assert stored_docs(tmp_path / "items.db") == {}
    assert "'meteorseed/anomalies/example_news': 1.0" in log
    # The seed's progress counts them as anomalies, not items (and so do the site's totals).
    keys = KeyLayout(namespace)
    progress = read_progress_sync(sync_redis, keys, ["s1"])["s1"]
    assert progress is not None and progress["state"] == "finished"
    assert (progress["anomalies"], progress["items"]) == (50, 0)
    assert sync_redis.hget(keys.only.crawl_site("example_news"), "anomalies") == "50"
    no_task_left(sync_redis, namespace)


def test_changed_rules_reach_a_running_worker(
        tmp_path: Path, redis_url: str, namespace: str, sites_dir: Path,
        demo_site: DemoSite) -> None:
    proc = start_sites_worker(tmp_path, redis_url, namespace, sites_dir, idle_close=0)
    try:
        base = f"{demo_site.url}/news/article/"
        enqueue_details(redis_url, namespace, [base + "1"])
        wait_for(lambda: "example_news:1" in stored_docs(tmp_path / "items.db"))
        news = sites_dir / "news.yaml"
        news.write_text(news.read_text().replace("version: 1", "version: 2").replace(
            'author: ".author::text"', 'author: ".author::text"\n  byline: ".byline"'))
        ids = itertools.count(2)

        def reloaded() -> bool:
            # One new article per check: whichever is parsed after the reload shows it.
            enqueue_details(redis_url, namespace, [base + str(next(ids))])
            docs = stored_docs(tmp_path / "items.db").values()
            return any(doc.get("rule_version") == "2" for doc in docs)

        wait_for(reloaded, timeout=60, interval=0.5)
        newest = [d for d in stored_docs(tmp_path / "items.db").values()
                  if d.get("rule_version") == "2"]
        assert newest[0]["byline"].startswith("<p class=\"byline\">By ")
        assert stored_docs(tmp_path / "items.db")["example_news:1"]["rule_version"] == "1"
    finally:
        proc.send_signal(signal.SIGTERM)
    log = finish(proc, tmp_path)
    assert "Reloaded site example_news: version 2 (was 1)" in log

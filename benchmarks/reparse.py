"""Re-parse from the page cache vs fetching: pages per second, and requests sent to the site.

A real ``scrapy crawl sites`` worker (politeness off, the example news rules with enough list
pages) crawls a local metered demo site with ``METEORSEED_PAGE_CACHE = True``: its pace is the
site's pages over the time between the first and the last request the site saw. Then
``meteorseed sites reparse example_news`` runs over the cache several times: its pace is the
pages it re-parsed (callback, sites pipeline with its Redis repost check, store upserts) over
its own time. The site counts the requests of each re-parse (expected: 0).

``--cost`` measures what the cache costs a crawl instead: the same crawl with the cache off and
on, alternating, each in a fresh namespace and store, pages/s of each (first to last request).

Run: ``.venv/bin/python benchmarks/reparse.py [--lists 50] [--rounds 3] [--no-dedup] [--cost]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from e2e_helpers import enqueue, stored_docs  # noqa: E402
from test_sites_e2e import PROJECT, finish, start_sites_worker  # noqa: E402

from meteorseed_scrapy.cli import main as meteorseed  # noqa: E402
from meteorseed_scrapy.testing.metered_site import MeteredSite  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402


def run(lists: int, rounds: int, dedup: bool = True) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-reparse-"))
    sites = workdir / "sites"
    sites.mkdir()
    rules = (PROJECT / "sites" / "news.yaml").read_text()
    rules = rules.replace("max_pages: 50", f"max_pages: {lists}")
    if not dedup:  # no repost check: no Redis round trip per item
        rules = rules.replace("dedup: {mode: mark,", "dedup: {mode: \"off\",")
    (sites / "news.yaml").write_text(rules)
    try:
        with RedisServer() as redis, MeteredSite(news_pages=lists) as site:
            enqueue(redis.url, "bench", [f"{site.url}/news/list/1"], site_id="example_news")
            finish(start_sites_worker(workdir, redis.url, "bench", sites, settings={
                "METEORSEED_PAGE_CACHE": True, "METEORSEED_POLITENESS": False}), workdir, 600)
            meter = site.meter(reset=True)
            fetched, span = meter["requests"], meter["last"] - meter["first"]
            docs = len(stored_docs(workdir / "items.db"))
            print(f"crawl: {fetched} pages fetched in {span:.2f} s (first to last request):"
                  f" {fetched / span:.0f} pages/s; {docs} documents")
            os.environ.update(METEORSEED_STORE_URI=f"sqlite:///{workdir / 'items.db'}",
                              METEORSEED_NAMESPACE="bench", METEORSEED_REDIS_URL=redis.url)
            rates = []
            for number in range(1, rounds + 1):
                out = io.StringIO()
                code = meteorseed(["sites", "reparse", "example_news", "--sites-dir",
                                   str(sites), "--json"], stdout=out)
                result = json.loads(out.getvalue())
                sent = site.meter(reset=True)["requests"]
                rates.append(result["pages"] / result["seconds"])
                print(f"reparse {number}: exit {code}, {result['pages']} pages,"
                      f" {result['items']} documents upserted in {result['seconds']:.2f} s:"
                      f" {rates[-1]:.0f} pages/s; requests to the site: {sent}")
            rate, pace = statistics.median(rates), fetched / span
            print(f"reparse: {rate:.0f} pages/s (median of {rounds}), {rate / pace:.1f}x the"
                  f" crawl's {pace:.0f} pages/s; requests to the site: {sent}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def cost(lists: int, rounds: int, apart: bool = False) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-reparse-cost-"))
    sites = workdir / "sites"
    sites.mkdir()
    rules = (PROJECT / "sites" / "news.yaml").read_text()
    (sites / "news.yaml").write_text(rules.replace("max_pages: 50", f"max_pages: {lists}"))
    paces: dict[bool, list[float]] = {False: [], True: []}
    try:
        with RedisServer() as redis, MeteredSite(news_pages=lists) as site:
            for number in range(rounds):
                for cached in (False, True) if number % 2 == 0 else (True, False):
                    run_dir = workdir / f"{number}-{cached}"
                    run_dir.mkdir()
                    namespace = f"cost{number}{int(cached)}"
                    enqueue(redis.url, namespace, [f"{site.url}/news/list/1"],
                            site_id="example_news")
                    settings = {"METEORSEED_PAGE_CACHE": cached, "METEORSEED_POLITENESS": False}
                    if apart:  # the cache in an SQLite file of its own, not the store's
                        settings["METEORSEED_PAGE_CACHE_URI"] = f"sqlite:///{run_dir}/pages.db"
                    finish(start_sites_worker(run_dir, redis.url, namespace, sites,
                                              settings=settings), run_dir, 600)
                    meter = site.meter(reset=True)
                    paces[cached].append(meter["requests"] / (meter["last"] - meter["first"]))
                    print(f"round {number + 1}, cache {'on' if cached else 'off'}:"
                          f" {paces[cached][-1]:.0f} pages/s")
        off, on = statistics.median(paces[False]), statistics.median(paces[True])
        print(f"crawl with the page cache: {on:.0f} pages/s, without: {off:.0f} pages/s"
              f" (medians of {rounds}): {on / off:.2f}x")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lists", type=int, default=50, help="news list pages (10 articles each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-dedup", action="store_true", help="the rules without content"
                        " dedup (no repost check, no Redis round trip per item)")
    parser.add_argument("--cost", action="store_true", help="the crawl with the cache off and"
                        " on instead")
    parser.add_argument("--apart", action="store_true", help="with --cost: the cache in an"
                        " SQLite file of its own")
    options = parser.parse_args()
    if options.cost:
        cost(options.lists, options.rounds, options.apart)
    else:
        run(options.lists, options.rounds, not options.no_dedup)

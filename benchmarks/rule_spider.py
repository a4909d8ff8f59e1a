"""Rule spider vs a hand-written spider, and hot-reload latency.

1. Parse throughput: the demo site's news articles and shop products are fetched once; then
   the ``sites`` rule spider (rules with the hand-written spider's selectors) and the ``demo``
   spider parse fresh responses of them, best of several rounds. Downloads, Redis and the
   store are left out on purpose: they are the same for both spiders, so the ratio isolates
   what the rules engine costs (extraction, processors, normalisation, validation, anomaly
   counting, the item it yields; sampling is off in both). The content fingerprint is computed
   in the sites item pipeline, next to its Redis round trip, and is not part of this figure.
2. Hot-reload latency: a real ``scrapy crawl sites`` worker is fed article tasks; the rule file
   is saved with a new version and the clock runs until the first stored document carries it.

Run: ``.venv/bin/python benchmarks/rule_spider.py [--rounds 7] [--reloads 3]``.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "example_project")]

from demo_project.spiders.demo import DemoSpider  # noqa: E402
from e2e_helpers import stored_docs  # noqa: E402
from scrapy.http import HtmlResponse, Request  # noqa: E402
from test_sites_e2e import enqueue_details, start_sites_worker  # noqa: E402

from meteorseed_scrapy.sites.loader import SiteRegistry  # noqa: E402
from meteorseed_scrapy.sites.spider import RuleSpider  # noqa: E402
from meteorseed_scrapy.task.context import TASK_META_KEY  # noqa: E402
from meteorseed_scrapy.task.exec_task import ExecTask  # noqa: E402
from meteorseed_scrapy.testing.polling import wait_for  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402
from meteorseed_scrapy.testing.sites import DemoSite  # noqa: E402

#: The hand-written spider's selectors, as rules (no extra normalisation: like for like).
BENCH_RULES = {
    "bench_news.yaml": """site_id: bench_news
version: 1
start: detail
fields:
  article: {from_url: true, regex: '/news/article/(\\d+)'}
  title: "h1.title::text"
  author: ".author::text"
  published: "time.date::attr(datetime)"
  body: {css: ".body p::text", join: "\\n\\n"}
unique_key: article
sampling: {every: 0}
""",
    "bench_shop.yaml": """site_id: bench_shop
version: 1
start: detail
fields:
  sku: ".sku::text"
  name: "h1.name::text"
  price: ".price::text"
  price_value: {css: ".price::text", processors: [float]}
  currency: ".currency::text"
  in_stock: {css: ".stock::text", regex: "In stock"}
unique_key: sku
sampling: {every: 0}
""",
}


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return bytes(reply.read())


def responses(pages: list[tuple[str, str, bytes]]) -> list[HtmlResponse]:
    out = []
    for site_id, url, body in pages:
        task = ExecTask.create(seed_id="b", site_id=site_id, url=url)
        request = Request(url, meta={TASK_META_KEY: task})
        out.append(HtmlResponse(url, body=body, encoding="utf-8", request=request))
    return out


def rate(parse: Callable[[HtmlResponse], Iterable[Any]], pages: list[tuple[str, str, bytes]],
         rounds: int, repeat: int = 20) -> float:
    """Best pages/s over ``rounds`` rounds of ``repeat`` passes over fresh responses."""
    best = 0.0
    for _ in range(rounds):
        batch = [r for _ in range(repeat) for r in responses(pages)]
        start = time.perf_counter()
        items = 0
        for response in batch:
            for output in parse(response):
                items += 1
                if hasattr(output, "output"):
                    output.output()  # what leaves the rule spider's item stage
        elapsed = time.perf_counter() - start
        assert items == len(batch), "every page must yield one item"
        best = max(best, len(batch) / elapsed)
    return best


def parse_benchmark(site: DemoSite, rounds: int) -> float:
    rules = Path(tempfile.mkdtemp(prefix="rules-"))
    for name, text in BENCH_RULES.items():
        (rules / name).write_text(text)
    rule_spider = RuleSpider(registry=SiteRegistry(rules).load())
    hand = DemoSpider()
    pages = [("bench_news", f"{site.url}/news/article/{i}", b"") for i in range(1, 51)]
    pages += [("bench_shop", f"{site.url}/shop/product/{i}", b"") for i in range(1, 31)]
    pages = [(s, url, fetch(url)) for s, url, _ in pages]
    # Alternate the two, so drift (CPU frequency, other load) hits both alike.
    rule_rates, hand_rates = [], []
    for _ in range(3):
        hand_rates.append(rate(hand.parse, pages, rounds))
        rule_rates.append(rate(rule_spider.parse_detail, pages, rounds))
    shutil.rmtree(rules)
    rule_rate, hand_rate = max(rule_rates), max(hand_rates)
    print(f"parse: hand-written demo spider {hand_rate:,.0f} pages/s, rule spider"
          f" {rule_rate:,.0f} pages/s ({len(pages)} news + shop pages, best of {rounds * 3})")
    return rule_rate / hand_rate


def reload_benchmark(site: DemoSite, reloads: int) -> list[float]:
    tmp = Path(tempfile.mkdtemp(prefix="reload-"))
    shutil.copytree(REPO / "example_project" / "sites", tmp / "sites")
    news = tmp / "sites" / "news.yaml"
    ids = itertools.count(1)
    latencies = []
    with RedisServer() as redis_server:
        url, ns = redis_server.url, "bench"
        enqueue_details(url, ns, [f"{site.url}/news/article/{next(ids)}"])
        worker = start_sites_worker(tmp, url, ns, tmp / "sites", idle_close=0)
        try:
            wait_for(lambda: stored_docs(tmp / "items.db"), timeout=60)
            for version in range(2, reloads + 2):
                text = news.read_text()
                news.write_text(text.replace(f"version: {version - 1}", f"version: {version}"))
                saved = time.time()

                def reached(v: int = version) -> bool:
                    # A steady trickle of tasks, as a busy worker would have.
                    enqueue_details(url, ns, [f"{site.url}/news/article/{next(ids)}"])
                    return any(d.get("rule_version") == str(v)
                               for d in stored_docs(tmp / "items.db").values())

                wait_for(reached, timeout=60, interval=0.05)
                latencies.append(time.time() - saved)
                print(f"reload to version {version}: first item parsed with it after"
                      f" {latencies[-1]:.2f} s")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
    shutil.rmtree(tmp)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reloads", type=int, default=3)
    args = parser.parse_args()
    with DemoSite(news_pages=200, shop_categories=3) as site:  # 2000 distinct articles
        ratio = parse_benchmark(site, args.rounds)
        latencies = reload_benchmark(site, args.reloads)
    worst = max(latencies)
    print(f"rule spider / hand-written: {ratio:.2f}x (goal >= 0.85x); hot reload: median"
          f" {statistics.median(latencies):.2f} s, worst {worst:.2f} s over {len(latencies)}"
          f" saves (goal <= 5 s)")


if __name__ == "__main__":
    main()

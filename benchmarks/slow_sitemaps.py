"""``meteorseed serve`` while slow sitemaps are being expanded: does the API still answer?

A local slow-drip sitemap site on 127.0.0.1 (the start of a sitemap, then a byte every
``--drip`` seconds, never ending), a throwaway local Redis, the API in a thread
(:class:`~meteorseed_scrapy.api.background.ServerThread`, with
``METEORSEED_FETCH_PRIVATE_ADDRESSES`` on: the site is on loopback). 60 sitemap seeds are
dispatched, one request each: up to ``--max-expansions`` expand in the background, the others
are answered 503 with Retry-After. Then ``GET /status`` and ``GET /dead-letters`` are timed
``--requests`` times each while those expansions hang on the drip. The last line gives p50/p99
of ``GET /status``; the goal is p99 <= 100 ms.
Run: ``.venv/bin/python benchmarks/slow_sitemaps.py [--requests 200]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from meteorseed_scrapy.api.background import ServerThread
from meteorseed_scrapy.api.config import ApiConfig
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import RedisServer
from meteorseed_scrapy.testing.sitemaps import SitemapHost

TOKEN = "bench"
SITEMAPS = 60


def call(base: str, path: str, body: Any = None) -> tuple[float, int]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="POST" if data else "GET",
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              "Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        exc.read()
        status = exc.code
    return time.perf_counter() - start, status


def percentiles(times: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=200, help="GETs of each route")
    parser.add_argument("--drip", type=float, default=0.5, help="seconds between bytes")
    parser.add_argument("--max-expansions", type=int, default=16,
                        help="background expansions at once (ApiConfig.max_expansions)")
    opts = parser.parse_args()
    with RedisServer() as redis_server, SitemapHost() as site:
        site.drips["/slow.xml"] = opts.drip
        config = ApiConfig(redis_url=redis_server.url, token=TOKEN,
                           namespace="b" + uuid.uuid4().hex[:8], fetch_private_addresses=True,
                           max_expansions=opts.max_expansions)
        with ServerThread(config) as server:
            answers: dict[int, int] = {}
            dispatch_times = []
            for n in range(SITEMAPS):
                elapsed, status = call(server.url, "/dispatch", {
                    "seed_id": f"map{n}", "site_id": "slow", "task_type": "sitemap",
                    "payload": {"url": f"{site.url}/slow.xml"}})
                answers[status] = answers.get(status, 0) + 1
                dispatch_times.append(elapsed)
            running = answers.get(202, 0)
            wait_for(lambda: site.drips_started >= running)  # every one hangs on the drip now
            p50, p99 = percentiles(dispatch_times)
            print(f"POST /dispatch x {SITEMAPS} sitemaps: "
                  + ", ".join(f"{count} x {status}" for status, count in sorted(answers.items()))
                  + f"; p50 {p50:.1f} ms, p99 {p99:.1f} ms")
            print(f"{running} sitemaps dripping one byte every {opts.drip:g} s "
                  f"({site.drips_started} fetches under way)")
            timings: dict[str, list[float]] = {"/dead-letters": [], "/status": []}
            for _ in range(opts.requests):
                for path, times in timings.items():
                    elapsed, status = call(server.url, path)
                    assert status == 200, (path, status)
                    times.append(elapsed)
            assert site.drips_ended == 0, "a sitemap fetch ended during the measurement"
            for path, times in timings.items():
                p50, p99 = percentiles(times)
                print(f"GET {path} x {len(times)}: p50 {p50:.1f} ms, p99 {p99:.1f} ms "
                      f"(max {max(times) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()

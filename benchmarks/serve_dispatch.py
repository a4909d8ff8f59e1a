"""``meteorseed serve``: latency of ``POST /dispatch`` and of the server during a big expansion.

Runs the API in a thread (:class:`~meteorseed_scrapy.api.background.ServerThread`) on a
throwaway local Redis. ``url_list`` seeds of 1, 100 and 10 000 URLs are expanded before the
answer (5 runs each, a fresh namespace per run); a 200 000-URL template expands in the
background while ``GET /seeds/{id}`` is polled.
Run: ``.venv/bin/python benchmarks/serve_dispatch.py``
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
import uuid
from typing import Any

from meteorseed_scrapy.api.background import ServerThread
from meteorseed_scrapy.api.config import ApiConfig
from meteorseed_scrapy.testing.redis_server import RedisServer

TOKEN = "bench"


def call(base: str, path: str, body: Any = None) -> tuple[float, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="POST" if data else "GET",
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              "Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        out = json.loads(response.read())
    return time.perf_counter() - start, out


def main() -> None:
    with RedisServer() as redis_server:
        for n in (1, 100, 10_000):
            times = []
            for run in range(5):
                config = ApiConfig(redis_url=redis_server.url, token=TOKEN,
                                   namespace="b" + uuid.uuid4().hex[:8])
                with ServerThread(config) as server:
                    urls = [f"https://site{run}.example/p/{i}" for i in range(n)]
                    elapsed, out = call(server.url, "/dispatch", {
                        "seed_id": "s", "site_id": "x", "task_type": "url_list",
                        "payload": {"urls": urls}})
                    assert out["enqueued"] == n, out
                    times.append(elapsed)
            shown = ", ".join(f"{t * 1000:.0f}" for t in times)
            print(f"url_list {n:>6} URLs, inline: median {statistics.median(times) * 1000:.1f} ms"
                  f" (runs: {shown} ms)")
        config = ApiConfig(redis_url=redis_server.url, token=TOKEN,
                           namespace="b" + uuid.uuid4().hex[:8])
        with ServerThread(config) as server:
            start = time.perf_counter()
            accepted, _ = call(server.url, "/dispatch", {
                "seed_id": "big", "site_id": "x", "task_type": "url_template",
                "payload": {"template": "https://big.example/p/{n}",
                            "params": {"n": {"start": 1, "stop": 200_000}}}})
            polls = []
            while True:
                elapsed, record = call(server.url, "/seeds/big")
                polls.append(elapsed)
                if record["expansion"]["state"] != "expanding":
                    break
                time.sleep(0.05)
            total = time.perf_counter() - start
            print(f"url_template 200000 URLs, background: 202 in {accepted * 1000:.1f} ms, "
                  f"{record['expansion']['enqueued']} enqueued in {total:.1f} s; GET /seeds/big "
                  f"meanwhile: median {statistics.median(polls) * 1000:.1f} ms, "
                  f"max {max(polls) * 1000:.1f} ms ({len(polls)} polls)")


if __name__ == "__main__":
    main()

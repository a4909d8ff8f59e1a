"""The fleet-wide adaptive limit end to end: real workers against a loopback site whose latency
grows with its load, measured at the server (requests in flight, requests per second).

Generous tolerances, averages over the steady part of a short run: no wall-clock thresholds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.load_site import LoadSite
from meteorseed_scrapy.testing.polling import wait_for
from tests.e2e_helpers import enqueue, start_worker, stored_docs

pytestmark = pytest.mark.e2e

ADAPTIVE = {
    "AUTOTHROTTLE_ENABLED": True,
    "AUTOTHROTTLE_TARGET_CONCURRENCY": 2,
    "AUTOTHROTTLE_START_DELAY": 0.1,
    "METEORSEED_IDLE_CLOSE": 2,
}


def test_two_workers_hold_the_target_in_flight_in_total_not_each(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    n = 240
    with LoadSite(base_ms=50, per_request_ms=25) as site:
        enqueue(redis_url, namespace, [f"{site.url}/p/{i}" for i in range(n)])
        workers = [start_worker(tmp_path, redis_url, namespace, name=f"w{k}", **ADAPTIVE)
                   for k in (1, 2)]
        # The steady part: after the delay came down from its start, before the queue drains.
        wait_for(lambda: site.served() >= 60, 120, 0.05)
        start = site.arrivals()[-1]
        wait_for(lambda: site.served() >= n - 40, 120, 0.05)
        end = site.arrivals()[-1]
        in_flight = site.in_flight(start, end)
        for worker in workers:
            assert worker.wait() == 0, worker.log()[-3000:]
    # Scrapy's per-process AutoThrottle in each of the 2 workers would hold about 2 x 2.
    assert 1.2 <= in_flight <= 2.8, in_flight
    assert len(stored_docs(tmp_path / "items.db")) == n
    state = sync_redis.hgetall(f"{namespace}:{{probe}}:adaptive")
    assert float(state["delay"]) > 0 and int(state["updates"]) >= 2
    assert sync_redis.zscore(KeyLayout(namespace).adaptive_sites, "probe") is not None
    for worker in workers:
        log = worker.log()
        # The hand-over: the add-on says so, and Scrapy's AutoThrottle is not enabled.
        assert "per-process AutoThrottle is off" in log
        assert "scrapy.extensions.throttle.AutoThrottle" not in log


def test_robots_crawl_delay_caps_the_fleet_rate(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    n = 20
    robots = "User-agent: *\nCrawl-delay: 0.25\n"  # 4 requests a second, whole fleet
    with LoadSite(base_ms=5, per_request_ms=0, robots=robots) as site:
        enqueue(redis_url, namespace, [f"{site.url}/p/{i}" for i in range(n)])
        workers = [start_worker(tmp_path, redis_url, namespace, name=f"w{k}",
                                ROBOTSTXT_OBEY=True) for k in (1, 2)]
        for worker in workers:
            assert worker.wait() == 0, worker.log()[-3000:]
        arrivals = sorted(site.arrivals())
    assert len(arrivals) == n
    rate = (n - 1) / (arrivals[-1] - arrivals[0])
    assert rate <= 4.0 * 1.05, rate  # the configured rate would be 1000 a second
    assert len(stored_docs(tmp_path / "items.db")) == n
    host = site.url.split("//", 1)[1]
    assert float(sync_redis.hget(f"{namespace}:{{probe}}:robots", host) or 0) == 250

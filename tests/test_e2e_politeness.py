"""Politeness end to end: durable retries, pauses, the fleet-wide caps, seen from the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.faults import FaultSite
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker, stored_docs

pytestmark = pytest.mark.e2e


def test_5xx_is_retried_durably_and_dead_lettered_when_retries_run_out(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    recovers = f"{demo_site.url}/flaky/{namespace}-a/2?code=503"  # two 503s, then 200
    hopeless = f"{demo_site.url}/flaky/{namespace}-b/9?code=502"
    enqueue(redis_url, namespace, [recovers, hopeless])
    worker = start_worker(tmp_path, redis_url, namespace, RETRY_TIMES=2,
                          METEORSEED_BACKOFF_BASE=0.2)
    assert worker.wait() == 0, worker.log()[-3000:]

    assert set(stored_docs(tmp_path / "items.db")) == {
        f"probe:/flaky/{namespace}-a/2?code=503"
    }
    assert demo_site.hits(f"/flaky/{namespace}-a/2") == 3
    assert demo_site.hits(f"/flaky/{namespace}-b/9") == 3  # first try + 2 retries
    (dead,) = sync_redis.xrange(keys.dead)
    assert dead[1]["reason"] == "HTTP 502 after 2 retries"
    stats = worker.stats()
    assert stats["meteorseed/deferred"] == 4
    assert stats["meteorseed/retry/probe/HTTP_503"] == 2
    assert sync_redis.zcard(keys.delayed) == 0
    assert sync_redis.xlen(keys.stream) == 0


def test_a_waiting_retry_survives_the_death_of_its_worker(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    url = f"{demo_site.url}/flaky/{namespace}/1?code=503"
    enqueue(redis_url, namespace, [url])
    first = start_worker(tmp_path, redis_url, namespace, name="w1", METEORSEED_BACKOFF_BASE=3,
                         METEORSEED_IDLE_CLOSE=0)
    # The retry waits in Redis, not in the worker's memory: killing the worker loses nothing.
    wait_for(lambda: sync_redis.zcard(keys.delayed) == 1, 30, 0.05)
    first.kill()
    assert sync_redis.xlen(keys.stream) == 0  # acked and deleted when it was deferred
    second = start_worker(tmp_path, redis_url, namespace, name="w2")
    assert second.wait() == 0, second.log()[-3000:]
    assert set(stored_docs(tmp_path / "items.db")) == {f"probe:/flaky/{namespace}/1?code=503"}
    assert demo_site.hits(f"/flaky/{namespace}/1") == 2
    assert sync_redis.xlen(keys.dead) == 0


def test_404_and_410_are_never_retried(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    enqueue(redis_url, namespace, [f"{demo_site.url}/status/404?n={namespace}",
                                   f"{demo_site.url}/status/410?n={namespace}"])
    before = demo_site.hits("/status/404"), demo_site.hits("/status/410")
    worker = start_worker(tmp_path, redis_url, namespace, RETRY_TIMES=3)
    assert worker.wait() == 0
    assert (demo_site.hits("/status/404"), demo_site.hits("/status/410")) == (
        before[0] + 1, before[1] + 1
    )
    stats = worker.stats()
    assert stats["meteorseed/outcome/gone"] == 2
    assert "meteorseed/deferred" not in stats
    assert sync_redis.xlen(KeyLayout(namespace).dead) == 0


@pytest.fixture
def fault_site() -> Iterator[FaultSite]:
    with FaultSite() as site:
        yield site


def test_the_concurrency_cap_holds_across_workers_at_the_server(
    tmp_path: Path, redis_url: str, namespace: str, fault_site: FaultSite
) -> None:
    fault_site.set_mode("a", "slow", delay=0.4)
    urls = [f"{fault_site.url}/a/page/{i}" for i in range(30)]
    enqueue(redis_url, namespace, urls, site_id="a")
    workers = [
        start_worker(tmp_path, redis_url, namespace, name=f"w{i}", METEORSEED_SITE_CONCURRENCY=3,
                     CONCURRENT_REQUESTS=16)
        for i in (1, 2, 3)
    ]
    for worker in workers:
        assert worker.wait() == 0, worker.log()[-3000:]
    assert len(stored_docs(tmp_path / "items.db")) == 30
    assert fault_site.max_in_flight("a") == 3  # reached, never exceeded


def test_a_429_with_retry_after_pauses_the_site_on_every_worker(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    fault_site: FaultSite
) -> None:
    fault_site.set_mode("a", 429, retry_after=2, times=1)
    urls = [f"{fault_site.url}/a/page/{i}" for i in range(40)]
    enqueue(redis_url, namespace, urls, site_id="a")
    settings = {"METEORSEED_SITE_RATE": 20, "METEORSEED_SITE_BURST": 1}
    workers = [start_worker(tmp_path, redis_url, namespace, name=f"w{i}", **settings)
               for i in (1, 2)]
    for worker in workers:
        assert worker.wait() == 0, worker.log()[-3000:]
    hits = fault_site.hits("a")
    (throttled,) = [h for h in hits if h.status == 429]
    assert throttled.finish is not None
    during = [h for h in hits if throttled.finish + 0.2 < h.arrival < throttled.finish + 1.8]
    assert during == [], "no request may reach the site while it is paused"
    assert len(stored_docs(tmp_path / "items.db")) == 40  # the throttled task included
    assert sync_redis.xlen(KeyLayout(namespace).dead) == 0


def test_the_breaker_spares_a_site_that_is_down_and_loses_no_task(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    fault_site: FaultSite
) -> None:
    urls = [f"{fault_site.url}/a/page/{i}" for i in range(80)]
    enqueue(redis_url, namespace, urls, site_id="a")
    fault_site.set_mode("a", 503, duration=6)
    settings = {"METEORSEED_SITE_RATE": 40, "METEORSEED_SITE_BURST": 5,
                "METEORSEED_BREAKER_WINDOW": 3, "METEORSEED_BREAKER_MIN_REQUESTS": 5,
                "METEORSEED_BREAKER_PROBE_INTERVAL": 1, "RETRY_TIMES": 2,
                "METEORSEED_BACKOFF_BASE": 0.5}
    workers = [start_worker(tmp_path, redis_url, namespace, name=f"w{i}", **settings)
               for i in (1, 2)]
    for worker in workers:
        assert worker.wait(180) == 0, worker.log()[-3000:]
    down = [h for h in fault_site.hits("a") if h.status == 503]
    # Without the breaker every task would fail three times (240 requests) and be dead-lettered.
    assert len(down) < 80
    assert sum(w.stats().get("meteorseed/breaker/a/open", 0) for w in workers) >= 1
    assert len(stored_docs(tmp_path / "items.db")) == 80
    assert sync_redis.xlen(KeyLayout(namespace).dead) == 0

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
    fault_site.set_mode("a", 503, duration=6, from_first_hit=True)  # (start-up takes a while)
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


def test_a_burst_of_429s_to_16_requests_in_flight_is_one_strike_at_the_server(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    fault_site: FaultSite
) -> None:
    # The first 16 requests answer 429 (Retry-After: 3) after 0.3 s: all 16 are in flight
    # when the first 429 arrives. Before, each one was a strike: the site was paused ~320 s.
    fault_site.set_mode("a", 429, retry_after=3, delay=0.3, times=16)
    urls = [f"{fault_site.url}/a/page/{i}" for i in range(40)]
    enqueue(redis_url, namespace, urls, site_id="a")
    worker = start_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=16,
                          CONCURRENT_REQUESTS_PER_DOMAIN=16, LOG_LEVEL="INFO")
    assert worker.wait() == 0, worker.log()[-3000:]

    hits = fault_site.hits("a")
    throttled = [h for h in hits if h.status == 429]
    assert len(throttled) == 16
    first = min(h.finish for h in throttled if h.finish is not None)
    assert sum(h.arrival < first for h in hits) == 16  # all 16 in flight at the first 429
    after = sorted(h.arrival - first for h in hits if h.arrival > first)
    # Nothing reaches the site during the pause (0.5-2.5 s is the window; none at all
    # is what it does), and it resumes Retry-After (+ up to 10 % jitter) after the first 429.
    assert not [d for d in after if d < 2.9], after[:5]
    assert after[0] < 3.3 + 1.0, after[:5]
    assert len(stored_docs(tmp_path / "items.db")) == 40
    assert sync_redis.xlen(KeyLayout(namespace).dead) == 0
    stats = worker.stats()
    assert stats["meteorseed/throttled/a/429"] == 16
    assert stats["meteorseed/throttled/a/strikes"] == 1
    assert str(sync_redis.get(KeyLayout(namespace).site("a", "strikes"))).startswith("1:")


def test_a_site_with_corrupt_gate_state_waits_alone_and_others_keep_flowing(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    fault_site: FaultSite
) -> None:
    keys = KeyLayout(namespace)
    bucket = keys.site("bad", "bucket")
    sync_redis.set(bucket, "corrupt")  # a string where gate.lua keeps a hash
    good = [f"{fault_site.url}/good/page/{i}" for i in range(30)]
    bad = [f"{fault_site.url}/bad/page/{i}" for i in range(5)]
    enqueue(redis_url, namespace, bad, site_id="bad")
    enqueue(redis_url, namespace, good, site_id="good")
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_IDLE_CLOSE=0,
                          METEORSEED_SITE_RATE=20, METEORSEED_SITE_BURST=2)
    try:
        wait_for(lambda: len(stored_docs(tmp_path / "items.db")) == 30, 60, 0.1)
        assert not fault_site.hits("bad")  # its tasks wait, none lost
        log = worker.log()
        failed = [line for line in log.splitlines() if "gate call of site bad failed" in line]
        assert len(failed) == 1 and "WRONGTYPE" in failed[0], failed
        assert "Redis refused a command" not in log  # no loop-wide error any more
        sync_redis.delete(bucket)  # repaired: the site gets permits again
        wait_for(lambda: len(stored_docs(tmp_path / "items.db")) == 35, 120, 0.1)
        wait_for(lambda: "gate call of site bad works again" in worker.log(), 10, 0.1)
    finally:
        worker.kill()
    assert sync_redis.xlen(keys.dead) == 0


def test_a_batch_crawl_gives_up_on_a_dead_host_and_ends(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
    demo_site: DemoSite, refused_port: int
) -> None:
    keys = KeyLayout(namespace)
    good = [f"{demo_site.url}/shop/product/{i}" for i in range(1, 21)]
    down = [f"http://127.0.0.1:{refused_port}/page/{i}" for i in range(3)]
    enqueue(redis_url, namespace, good)
    enqueue(redis_url, namespace, down, site_id="down", seed_id="s2")
    # The batch rule: at most METEORSEED_BATCH_GIVE_UP_AFTER (60 s by default; 5 here, to be
    # quick) of continuous trouble, then the site's tasks are dead; GIVE_UP_AFTER (a day) alone
    # would keep the worker waiting.
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_IDLE_CLOSE=3,
                          RETRY_TIMES=2, METEORSEED_BATCH_GIVE_UP_AFTER=5)
    assert worker.wait(120) == 0, worker.log()[-3000:]

    assert len(stored_docs(tmp_path / "items.db")) == 20
    dead = sync_redis.xrange(keys.dead)
    assert len(dead) == 3
    assert all(f["reason"].startswith("site down since ") for _, f in dead), dead
    assert sync_redis.zcard(keys.delayed) == 0
    assert sync_redis.xlen(keys.stream) == 0
    assert worker.stats()["meteorseed/given_up/down"] == 3

"""End to end: one real worker, tasks in every lane, realtime tasks arriving while a scheduled
backlog and retry-lane tasks are being worked through."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import add_tasks, start_worker, stored_docs

pytestmark = pytest.mark.e2e


def add(redis_url: str, namespace: str, urls: list[str], lane: str, site: str = "probe") -> None:
    add_tasks(redis_url, namespace,
              [ExecTask.create(seed_id=lane, site_id=site, url=u, lane=lane) for u in urls])


def test_realtime_tasks_overtake_a_scheduled_backlog_and_every_lane_drains(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    site = demo_site.url
    scheduled = [f"/slow/100?i={i}" for i in range(120)]
    retry_lane = [f"/news/article/{i}" for i in range(1, 16)]
    realtime = [f"/news/article/{i}" for i in range(16, 24)]
    flaky = f"/flaky/{namespace}/1"  # a 503 once: its durable retry waits in the retry lane
    # A 429 once (on a site of its own, so only that one is paused): back to its own lane.
    throttled = f"/flaky/{namespace}-429/1?code=429"
    add(redis_url, namespace, [site + p for p in scheduled], "scheduled")
    add(redis_url, namespace, [site + p for p in retry_lane], "retry")
    worker = start_worker(
        tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=4, METEORSEED_SITE_RATE=1000,
        METEORSEED_SITE_BURST=100, METEORSEED_SITE_CONCURRENCY=4, METEORSEED_BACKOFF_BASE=0.2,
    )
    store = tmp_path / "items.db"
    wait_for(lambda: len(stored_docs(store)) >= 5, 60, 0.05)
    add(redis_url, namespace, [site + p for p in [*realtime, flaky]], "realtime")
    add(redis_url, namespace, [site + throttled], "realtime", site="paused")

    def realtime_done() -> bool:
        return all(f"probe:{p}" in stored_docs(store) for p in realtime)

    wait_for(realtime_done, 60, 0.05)
    scheduled_by_then = sum(1 for p in scheduled if f"probe:{p}" in stored_docs(store))
    assert worker.wait() == 0, worker.log()[-3000:]

    # The realtime tasks were not queued behind the scheduled backlog.
    assert scheduled_by_then < len(scheduled)
    docs = stored_docs(store)
    assert {f"probe:{p}" for p in [*scheduled, *retry_lane, *realtime, flaky]} <= set(docs)
    assert f"paused:{throttled}" in docs
    stats = worker.stats()
    assert stats["meteorseed/read/scheduled"] == len(scheduled)
    # + the flaky page, + the throttled one twice (before and after its pause)
    assert stats["meteorseed/read/realtime"] == len(realtime) + 3
    assert stats["meteorseed/read/retry"] == len(retry_lane) + 1  # + the flaky page's retry
    keys = KeyLayout(namespace)
    for stream in keys.streams:
        assert sync_redis.xlen(stream) == 0, stream
        assert sync_redis.xpending(stream, keys.group)["pending"] == 0, stream
    assert sync_redis.zcard(keys.delayed) == 0
    assert sync_redis.xlen(keys.dead) == 0

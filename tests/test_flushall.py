"""Redis emptied under a running worker (FLUSHALL, or every key of the namespace deleted):
its pending tasks are reported as lost, never as "taken over by another worker" when there is
none."""

from __future__ import annotations

import signal
from pathlib import Path

import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker


def test_every_key_of_the_namespace_deleted_is_loss_not_a_take_over(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite,
) -> None:
    keys = KeyLayout(namespace)
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    enqueue(redis_url, namespace, [f"{demo_site.url}/slow/30000?{i}" for i in range(4)])
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_IDLE_CLOSE=0)
    wait_for(lambda: sync_redis.xpending(keys.stream, keys.group)["pending"] == 4, 60)
    # FLUSHALL as far as this namespace goes (the shared test Redis holds other tests' keys):
    # streams, the group, the live-worker registry, heartbeats, dedup sets.
    for key in list(sync_redis.scan_iter(f"{namespace}:*")):
        sync_redis.delete(key)
    try:
        wait_for(lambda: "Redis lost" in worker.log(), 60, 0.05)
    except AssertionError:
        raise AssertionError(worker.log()[-6000:]) from None
    worker.signal(signal.SIGINT)
    worker.wait(60)
    log = worker.log()
    assert "Redis lost 4 task message(s)" in log, log[-3000:]
    assert "taken over by another worker" not in log

"""A spider's errback runs once, at its task's final failure, as in stock Scrapy: not at every
durable retry or pause; an errback that returns items handled the failure (the task is acked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import PROJECT, REPO, Worker, add_tasks, stored_docs
from tests.subprocess_env import python_path

pytestmark = pytest.mark.e2e


def start_errback_worker(tmp_path: Path, redis_url: str, namespace: str,
                         **overrides: Any) -> Worker:
    log_path, stats_path = tmp_path / "w1.log", tmp_path / "w1.stats.json"
    settings = {
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_STORE_URI": f"sqlite:///{tmp_path / 'items.db'}",
        "METEORSEED_CONSUMER": "w1", "METEORSEED_IDLE_CLOSE": 2, "RETRY_TIMES": 2,
        "LOG_FILE": str(log_path), "PROBE_STATS_FILE": str(stats_path), **overrides,
    }
    args = [sys.executable, "-m", "scrapy.cmdline", "crawl", "errback_probe"]
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    env = dict(os.environ, PYTHONPATH=python_path(REPO, PROJECT))
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    proc = subprocess.Popen(args, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return Worker("w1", proc, log_path, stats_path)


def enqueue_with_errback(redis_url: str, namespace: str, urls: list[str],
                         **fields: Any) -> None:
    fields.setdefault("errback", "on_error")
    add_tasks(redis_url, namespace,
              [ExecTask.create(seed_id="s1", site_id="probe", url=u, **fields) for u in urls])


def test_the_errback_runs_once_at_the_final_failure_and_may_handle_it(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    handled = f"{demo_site.url}/status/500?handle=1&n={namespace}"
    unhandled = f"{demo_site.url}/status/503?n={namespace}"
    enqueue_with_errback(redis_url, namespace, [handled, unhandled])
    worker = start_errback_worker(tmp_path, redis_url, namespace)
    assert worker.wait() == 0, worker.log()[-3000:]

    # Exact targets (with the namespace in the query): the demo site is shared by the session.
    assert demo_site.hits(f"/status/500?handle=1&n={namespace}") == 3
    assert demo_site.hits(f"/status/503?n={namespace}") == 3
    stats = worker.stats()
    # Once per task (two durable retries each did not call it), with Scrapy's HttpError.
    assert stats["probe/errback"] == 2 and stats["probe/errback/HttpError"] == 2
    assert stats["retry/count"] == 4 and stats["retry/max_reached"] == 2
    assert set(stored_docs(tmp_path / "items.db")) == {"probe:errback:/status/500"}
    (dead,) = sync_redis.xrange(KeyLayout(namespace).dead)
    assert dead[1]["reason"] == "HTTP 503 after 2 retries"
    assert sync_redis.xlen(KeyLayout(namespace).stream) == 0
    assert sync_redis.zcard(KeyLayout(namespace).delayed) == 0


def test_a_task_given_up_on_while_parked_gets_its_errback_once_without_a_fetch(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    # A 403 pauses the site for a minute and starts its trouble; its task (no errback, no
    # retries) is dead at once.
    trigger = f"{demo_site.url}/status/403?retry_after=60&n={namespace}"
    enqueue_with_errback(redis_url, namespace, [trigger], errback=None,
                         meta={"max_retry_times": 0})
    worker = start_errback_worker(tmp_path, redis_url, namespace, METEORSEED_IDLE_CLOSE=4,
                                  METEORSEED_BATCH_GIVE_UP_AFTER=1)
    # The fleet's trouble clock runs (the worker's breaker learnt it in the same call): tasks
    # of the site read from now on are parked for the pause, never sent, then given up on.
    wait_for(lambda: sync_redis.exists(keys.site_own("probe", "probe", "trouble")), timeout=60)
    waiting = [f"/status/200?handle=1&p=1&n={namespace}", f"/status/200?p=2&n={namespace}",
               f"/status/200?p=3&n={namespace}"]
    enqueue_with_errback(redis_url, namespace, [demo_site.url + p for p in waiting])
    assert worker.wait() == 0, worker.log()[-3000:]

    assert [demo_site.hits(p) for p in waiting] == [0, 0, 0]
    stats = worker.stats()
    # Once each, with the give-up as its failure; the first errback's item handled it.
    assert stats["probe/errback"] == 3 and stats["probe/errback/TaskGivenUp"] == 3
    assert stats["meteorseed/given_up/probe"] == 3
    assert set(stored_docs(tmp_path / "items.db")) == {"probe:errback:/status/200"}
    reasons = sorted(f["reason"] for _, f in sync_redis.xrange(keys.dead))
    assert reasons[0] == "HTTP 403 after 0 retries"
    assert len(reasons) == 3 and all(r.startswith("site down since ") for r in reasons[1:])
    assert sync_redis.xlen(keys.stream) == 0
    assert sync_redis.zcard(keys.delayed) == 0

"""What an operator needs to see the fleet's health (issue 24.5): the oldest waiting task per
lane, live workers, Redis memory against ``maxmemory`` — in the queue snapshot, in
``meteorseed status`` and its ``--json``; against a real Redis."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest

from meteorseed_scrapy.observability.metrics import StatsCollector
from meteorseed_scrapy.observability.site_series import SiteSeries
from meteorseed_scrapy.queue.fleet.snapshot import RedisMemory
from meteorseed_scrapy.queue.inspect.status import read_status
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.test_cli import run


def add(r: redis.Redis, keys: KeyLayout, lane: str, n: int) -> None:
    stream = keys.stream_for(lane, 0)
    for i in range(n):
        task = ExecTask.create(seed_id="s1", site_id="news", url=f"https://news.test/{lane}/{i}",
                               lane=lane)
        r.xadd(stream, task.to_message())


@pytest.fixture
def maxmemory(sync_redis: redis.Redis) -> Iterator[None]:
    """``maxmemory`` just above what Redis uses now (given back after the test)."""
    before = sync_redis.config_get("maxmemory")["maxmemory"]
    used = int(sync_redis.info("memory")["used_memory"])
    sync_redis.config_set("maxmemory", int(used * 1.15))  # (0.87 of it, room either way)
    try:
        yield
    finally:
        sync_redis.config_set("maxmemory", before)


def test_oldest_waiting_task_is_given_per_lane(sync_redis: redis.Redis, namespace: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    add(sync_redis, keys, "scheduled", 3)
    status = read_status(sync_redis, keys)
    assert set(status.lane_lag_s) == {"scheduled"}
    assert status.lag_s == status.lane_lag_s["scheduled"] >= 0
    # An old realtime task: its id says when it was added.
    realtime = keys.stream_for("realtime", 0)
    sync_redis.xgroup_create(realtime, GROUP, id="0", mkstream=True)
    old_ms = int(time.time() * 1000) - 600_000
    sync_redis.xadd(realtime, ExecTask.create(seed_id="s", site_id="news",
                                              url="https://news.test/old").to_message(),
                    id=f"{old_ms}-0")
    status = read_status(sync_redis, keys)
    assert status.lane_lag_s["realtime"] >= 599
    assert status.lane_lag_s["scheduled"] < 60
    assert status.lag_s == status.lane_lag_s["realtime"]
    assert status.to_json()["lane_lag_s"]["realtime"] >= 599


def test_live_workers_count_only_unexpired_heartbeats(sync_redis: redis.Redis,
                                                      namespace: str) -> None:
    keys = KeyLayout(namespace)
    assert read_status(sync_redis, keys).live_workers == 0
    now_ms = int(time.time() * 1000)
    sync_redis.zadd(keys.workers, {"alive-1": now_ms + 60_000, "alive-2": now_ms + 60_000,
                                   "lapsed": now_ms - 60_000})
    assert read_status(sync_redis, keys).live_workers == 2


def test_memory_is_read_and_parsed_defensively(sync_redis: redis.Redis, namespace: str) -> None:
    memory = read_status(sync_redis, KeyLayout(namespace)).memory
    assert memory is not None and memory.used_bytes > 0
    assert RedisMemory.parse(ValueError("ERR unknown command 'INFO'")) is None
    assert RedisMemory.parse({"used_memory": "x"}) is None
    assert RedisMemory.parse({"used_memory": 10, "maxmemory": 0}).fraction is None  # type: ignore[union-attr]
    near = RedisMemory(85, 100, "noeviction")
    assert near.near_limit and not RedisMemory(79, 100, "noeviction").near_limit


def test_status_warns_when_redis_memory_is_near_maxmemory(
        sync_redis: redis.Redis, redis_url: str, namespace: str, maxmemory: None) -> None:
    code, out, err = run(redis_url, namespace, "status")
    assert code == 0, err
    assert "WARNING: Redis memory is at" in out and "of maxmemory" in out
    code, out, err = run(redis_url, namespace, "status", "--json")
    shown = json.loads(out)["redis_memory"]
    assert shown["near_limit"] is True and shown["max_bytes"] > 0
    assert shown["used_fraction"] >= 0.8  # (above 1 once the read itself grew it: still read)


def test_status_without_maxmemory_does_not_warn(redis_url: str, namespace: str) -> None:
    code, out, _ = run(redis_url, namespace, "status")
    assert code == 0 and "WARNING: Redis memory" not in out
    assert "no maxmemory" in out or "used of" in out


def test_status_after_the_workers_left_says_so(sync_redis: redis.Redis, redis_url: str,
                                               namespace: str) -> None:
    keys = KeyLayout(namespace)
    _code, out, _ = run(redis_url, namespace, "status")
    assert "no worker has read the streams yet" in out
    # A dead letter: some worker read and gave up a task; it has gone since.
    sync_redis.xadd(keys.dead, {"t": "{}", "reason": "HTTP 500"})
    _, out, _ = run(redis_url, namespace, "status")
    assert "the workers that read the streams have left" in out


# -- Prometheus series ---------------------------------------------------------------------------
class Stats:
    def __init__(self, values: dict[str, float]) -> None:
        self.values = values

    def get_stats(self) -> dict[str, float]:
        return self.values


def exposed(series: SiteSeries, stats: Stats) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(stats, series))
    return generate_latest(registry).decode()


def test_per_site_series_are_bounded_and_the_rest_is_summed_under_other() -> None:
    stats = Stats({f"meteorseed/retry/site{i}/http_503": 1 for i in range(1000)})
    series = SiteSeries(stats, 3)
    for i in range(1000):
        series.settled(f"site{i}", "done")
    text = exposed(series, stats)
    retries = [line for line in text.splitlines()
               if line.startswith("meteorseed_site_retries_total{")]
    tasks = [line for line in text.splitlines() if line.startswith("meteorseed_site_tasks_total{")]
    assert len(retries) == len(tasks) == 4  # 3 sites of their own + _other
    assert 'meteorseed_site_tasks_total{outcome="done",site="_other"} 997.0' in text
    assert 'meteorseed_site_retries_total{reason="http_503",site="_other"} 997.0' in text
    # Admission is sticky: a series never moves, so every counter only grows.
    before = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in tasks}
    series.settled("site999", "done")
    series.settled("brand-new", "dead")
    after = exposed(series, stats)
    for name, value in before.items():
        assert float(next(line for line in after.splitlines()
                          if line.startswith(name + " ")).rsplit(" ", 1)[1]) >= value
    assert 'meteorseed_site_tasks_total{outcome="dead",site="_other"} 1.0' in after


def test_anomalies_and_open_breakers_are_exposed_whatever_the_bound() -> None:
    stats = Stats({"meteorseed/anomalies/news": 0.25, "meteorseed/anomalies/news/checked": 8,
                   "meteorseed/anomalies/news/count": 2, "meteorseed/anomalies/news/jumps": 1})
    series = SiteSeries(stats, 0)  # 0: no site has series of its own
    for i in range(5):
        series.breaker(f"s{i}", "open" if i % 2 == 0 else "closed")
    text = exposed(series, stats)
    assert 'meteorseed_site_items_checked_total{site="_other"} 8.0' in text
    assert 'meteorseed_site_anomalies_total{site="_other"} 2.0' in text
    assert "meteorseed_breakers_open 3.0" in text
    assert "meteorseed_site_breaker_state{" not in text  # a state is not summed
    series = SiteSeries(stats, 10)
    series.breaker("news", "open")
    text = exposed(series, stats)
    assert 'meteorseed_site_anomalies_total{site="news"} 2.0' in text
    assert 'meteorseed_site_breaker_state{site="news"} 2.0' in text

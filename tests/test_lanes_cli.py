"""Lanes seen from the outside: ``meteorseed status``/``dead requeue``/``reset``, the queue
metrics, ``seed-expand --lane`` and the seed-expand backpressure over every lane."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis
from redis.asyncio import Redis

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.inspect.status import QueueSampler
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.subprocess_env import python_path
from tests.test_cli import add_dead, run, run_json

REPO = Path(__file__).resolve().parents[1]


def task(n: int, lane: str = "scheduled", priority: int = 0) -> ExecTask:
    return ExecTask.create(seed_id="s", site_id="news", url=f"https://news.test/{lane}/{n}",
                           lane=lane, priority=priority)


def enqueue(redis_url: str, keys: KeyLayout, tasks: list[ExecTask]) -> None:
    async def body() -> None:
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            await TaskWriter(client, keys).add(tasks)
        finally:
            await client.aclose()

    asyncio.run(body())


def test_status_shows_backlog_and_pending_per_lane(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    enqueue(redis_url, keys, [*(task(i, "realtime") for i in range(3)), task(9, "realtime", 1),
                              *(task(i) for i in range(5)), task(1, "retry", -1)])
    high = keys.task_stream("realtime", "high")
    sync_redis.xgroup_create(high, GROUP, id="0")
    sync_redis.xreadgroup(GROUP, "w1", {high: ">"}, count=1)

    status = run_json(redis_url, namespace, "status")

    assert (status["backlog"], status["pending"], status["stream_length"]) == (9, 1, 10)
    lanes = status["lanes"]
    assert {lane: (v["backlog"], v["pending"]) for lane, v in lanes.items()} == {
        "realtime": (3, 1), "scheduled": (5, 0), "retry": (1, 0)}
    assert lanes["realtime"]["bands"]["high"] == {"backlog": 0, "pending": 1}
    assert lanes["retry"]["bands"]["low"] == {"backlog": 1, "pending": 0}
    assert [c["name"] for c in status["consumers"]] == ["w1"]
    assert status["seen"] == {"news": 10}  # the two-layer dedup's entries, not a set's
    code, table, _ = run(redis_url, namespace, "status")
    assert code == 0 and "LANE" in table and "realtime" in table


def test_requeue_puts_a_task_back_in_its_lane_and_records_its_url_again(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    urgent = task(1, "realtime", 2)
    enqueue(redis_url, keys, [task(2)])  # the site's dedup root exists (a hash)

    async def release() -> bool:
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            return await TaskWriter(client, keys).release(urgent)
        finally:
            await client.aclose()

    dead_id = add_dead(sync_redis, keys, urgent.to_message()["t"])
    result = run_json(redis_url, namespace, "dead", "requeue", dead_id)

    assert [r["id"] for r in result["requeued"]] == [dead_id]
    [(_, fields)] = sync_redis.xrange(keys.task_stream("realtime", "high"))
    assert ExecTask.from_message(fields) == urgent
    assert asyncio.run(release())  # requeue recorded it in the two-layer dedup again


def test_reset_deletes_every_lane(sync_redis: redis.Redis, redis_url: str,
                                  namespace: str) -> None:
    keys = KeyLayout(namespace)
    enqueue(redis_url, keys, [task(1, "realtime"), task(2, "retry", 1), task(3)])
    assert run_json(redis_url, namespace, "reset", "--yes")["deleted"] >= 3
    assert not any(sync_redis.exists(s) for s in keys.streams)


def test_queue_sampler_sums_every_lane_and_finds_the_oldest_waiting_task(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    realtime = keys.task_stream("realtime", "normal")
    sync_redis.xadd(realtime, {"v": "1"}, id="1000-0")  # from 1970: decades old
    enqueue(redis_url, keys, [task(1), task(2, "retry")])

    async def body() -> Any:
        client = Redis.from_url(redis_url, decode_responses=True)
        consumer = StreamConsumer(client, keys, "c1")
        await consumer.ensure_group()
        await consumer.read(1, 0)  # the realtime one
        sampler = QueueSampler(redis_url, keys)
        try:
            return await sampler.sample()
        finally:
            await sampler.close()
            await client.aclose()

    sample = asyncio.run(body())
    assert (sample.length, sample.pending, sample.backlog) == (3, 1, 2)
    assert {lane: (v.backlog, v.pending) for lane, v in sample.lanes.items()} == {
        "realtime": (0, 1), "scheduled": (1, 0), "retry": (1, 0)}
    assert [(c.name, c.pending) for c in sample.consumers] == [("c1", 1)]
    assert 0 < sample.lag_s < 3600  # the realtime one was delivered: the others are new


def seed_expand(tmp_path: Path, redis_url: str, namespace: str, *args: str,
                stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "seed-expand", *args, "-",
         "-s", f"METEORSEED_REDIS_URL={redis_url}", "-s", f"METEORSEED_NAMESPACE={namespace}"],
        input=stdin, capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={"PYTHONPATH": python_path(REPO), "PATH": "/usr/bin:/bin"},
    )


def test_seed_expand_lane_option_and_seed_lane_field(
        tmp_path: Path, sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    seed = {"seed_id": "s1", "site_id": "news", "task_type": "url_list",
            "payload": {"urls": ["https://news.test/a", "https://news.test/b"]}}
    retry_seed = dict(seed, seed_id="s2", lane="retry",
                      payload={"urls": ["https://news.test/c"]})
    proc = seed_expand(tmp_path, redis_url, namespace, "--lane", "realtime",
                       stdin=json.dumps(seed) + "\n")
    assert proc.returncode == 0, proc.stderr
    proc = seed_expand(tmp_path, redis_url, namespace, stdin=json.dumps(retry_seed) + "\n")
    assert proc.returncode == 0, proc.stderr
    realtime = [ExecTask.from_message(f) for _, f in
                sync_redis.xrange(keys.task_stream("realtime", "normal"))]
    assert [(t.url, t.lane) for t in realtime] == [
        ("https://news.test/a", "realtime"), ("https://news.test/b", "realtime")]
    [(_, fields)] = sync_redis.xrange(keys.task_stream("retry", "normal"))
    assert ExecTask.from_message(fields).lane == "retry"
    bad = seed_expand(tmp_path, redis_url, namespace, "--lane", "urgent", stdin="")
    assert bad.returncode != 0 and "invalid choice" in bad.stderr
    watch = seed_expand(tmp_path, redis_url, namespace, "--lane", "realtime", "--watch",
                        stdin="")
    assert watch.returncode != 0 and "--lane does not go with --watch" in watch.stderr


def test_seed_expand_backpressure_counts_every_lane(
        tmp_path: Path, sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    enqueue(redis_url, keys, [task(1, "realtime"), task(2, "retry")])
    seed = {"seed_id": "s1", "site_id": "news", "task_type": "url_list",
            "payload": {"urls": ["https://news.test/x"]}}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy.cmdline", "seed-expand", "-",
         "-s", f"METEORSEED_REDIS_URL={redis_url}", "-s", f"METEORSEED_NAMESPACE={namespace}",
         "-s", "METEORSEED_MAX_BACKLOG=1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path, env={"PYTHONPATH": python_path(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(json.dumps(seed) + "\n")
    proc.stdin.close()
    line = proc.stderr.readline()  # waits for the first report: 2 waiting > 1
    assert "2 tasks waiting (more than 1)" in line
    assert proc.poll() is None and sync_redis.xlen(keys.stream) == 0
    sync_redis.delete(keys.task_stream("retry", "normal"))
    assert proc.wait(timeout=60) == 0
    assert proc.stdout is not None and "enqueued 1" in proc.stdout.read()

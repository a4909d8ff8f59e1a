"""Script calls inside pipelines (queue.plumbing.scripts.ScriptPipeline): one round trip, no SCRIPT
EXISTS,
and NOSCRIPT (a restarted or flushed Redis) handled by running the call again, in order.

Real Redis; the tests of one session run one after another, so the server-wide command
statistics read here are this test's own between its CONFIG RESETSTAT and its reading.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.consume.acks import Completion
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.scripts import ScriptPipeline
from meteorseed_scrapy.queue.shards import call_scripts
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client

ECHO = "return {KEYS[1], ARGV[1]}"


def script_calls(sync_redis: redis.Redis) -> int:
    """Calls of any SCRIPT subcommand since the last CONFIG RESETSTAT (Redis 7 counts each
    subcommand apart, 6.2 all under ``script``)."""
    stats: dict[str, Any] = sync_redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_script"))


def tasks(n: int, site: str = "news") -> list[ExecTask]:
    return [ExecTask.create(seed_id="s", site_id=site, url=f"https://{site}.example/p/{i}")
            for i in range(n)]


def complete_all(redis_url: str, keys: KeyLayout, sync_redis: redis.Redis, *,
                 flush_first: bool) -> dict[str, Any]:
    """Enqueue tasks on two sites' lanes, read them, then complete them all in one call."""

    async def body(client: Any) -> dict[str, Any]:
        writer = TaskWriter(client, keys)
        # Two sites on two lanes: the acks go to two streams, two script calls in the pipeline.
        batch = tasks(3, "news") + [
            ExecTask.create(seed_id="s", site_id="shop", url=f"https://shop.example/{i}",
                            lane="realtime") for i in range(3)]
        await writer.add(batch)
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        got = await consumer.read(10, 100)
        await consumer.complete([got[0].ref], 60)  # every script loaded once
        if flush_first:
            sync_redis.script_flush()
        sync_redis.config_resetstat()
        records = [(d.task, f'{{"n":{i}}}') for i, d in enumerate(got[1:]) if d.task]
        acked = await consumer.complete([d.ref for d in got[1:]], 60,
                                        done=[Completion(t, r) for t, r in records])
        done = [sync_redis.get(keys.for_site(t.site_id).done(t.task_id)) for t, _ in records]
        return {"read": len(got), "acked": acked, "done": done,
                "script_calls": script_calls(sync_redis)}

    return run_with_client(redis_url, body)


def test_complete_is_one_round_trip_without_script_exists(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    out = complete_all(redis_url, KeyLayout(namespace), sync_redis, flush_first=False)
    assert out["read"] == 6 and out["acked"] == 5
    assert all(out["done"])
    # redis-py's script(client=pipe) asked SCRIPT EXISTS before every pipeline (one more round
    # trip per completion on the worker's event loop).
    assert out["script_calls"] == 0


def test_complete_after_script_flush_loads_and_acks_everything(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    out = complete_all(redis_url, KeyLayout(namespace), sync_redis, flush_first=True)
    assert out["acked"] == 5 and all(out["done"])
    assert out["script_calls"] >= 1  # the SCRIPT LOAD of the rerun


@pytest.mark.parametrize("flush", [False, True])
def test_call_scripts_keeps_order_through_noscript(
        redis_url: str, namespace: str, sync_redis: redis.Redis, flush: bool) -> None:
    async def body(client: Any) -> list[Any]:
        script = client.register_script(ECHO)
        await script(keys=["warm"], args=["up"])
        if flush:
            sync_redis.script_flush()
        calls = [([f"{namespace}:k{i}"], [str(i)]) for i in range(5)]
        return await call_scripts(client, script, calls)

    replies = run_with_client(redis_url, body)
    assert replies == [[f"{namespace}:k{i}", str(i)] for i in range(5)]


def test_other_errors_are_raised_not_rerun(redis_url: str, namespace: str,
                                           sync_redis: redis.Redis) -> None:
    key = f"{namespace}:str"
    sync_redis.set(key, "x")
    failing = "return redis.call('HGET', KEYS[1], 'f')"  # WRONGTYPE on a string

    async def body(client: Any) -> Any:
        script = client.register_script(failing)
        async with client.pipeline(transaction=False) as pipe:
            batch = ScriptPipeline(pipe)
            batch.call(script, [key], [])
            pipe.incr(f"{namespace}:after")
            return await batch.execute()

    with pytest.raises(ResponseError, match="WRONGTYPE"):
        run_with_client(redis_url, body)
    assert sync_redis.get(f"{namespace}:after") == "1"  # the rest of the pipeline ran


def test_blocking_pipeline_reruns_after_noscript(namespace: str,
                                                 sync_redis: redis.Redis) -> None:
    echo = sync_redis.register_script(ECHO)
    echo(keys=["warm"], args=["up"])
    sync_redis.script_flush()
    with sync_redis.pipeline(transaction=False) as pipe:
        batch = ScriptPipeline(pipe)
        pipe.set(f"{namespace}:before", "1")
        batch.call(echo, [f"{namespace}:a"], ["1"])
        batch.call(echo, [f"{namespace}:b"], ["2"])
        replies = batch.execute_sync()
    assert replies[1:] == [[f"{namespace}:a", "1"], [f"{namespace}:b", "2"]]

"""A Redis above its ``maxmemory`` (policy ``noeviction``) refuses writes, and every command
queued in a MULTI, reads too. The reads that count in one MULTI still answer there: the queue
snapshot (``meteorseed status``, the API's ``/status``, the metrics), the writer's backlog and
the workers' reload of pushed site rules, since a full Redis is when an operator needs them. A
worker pauses (one line), loses nothing and goes on once Redis has room again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
from redis.exceptions import OutOfMemoryError, ResponseError
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector

from meteorseed_scrapy.politeness.site_errors import SiteFaults
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.enqueue.backlog import stream_counts
from meteorseed_scrapy.queue.inspect.status import QueueSampler, read_status
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis, async_client
from meteorseed_scrapy.queue.plumbing.reads import Batch, call, run_sync
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
from meteorseed_scrapy.sites.remote import Pushed, RemoteRules
from meteorseed_scrapy.sites.rulefile import parse_text
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client
from meteorseed_scrapy.testing.polling import wait_for, wait_until
from meteorseed_scrapy.testing.sites import DemoSite
from meteorseed_scrapy.worker.loops import Loops
from tests.e2e_helpers import enqueue, start_worker, stored_docs
from tests.test_cli import run

RULE = (Path(__file__).resolve().parents[1] / "example_project/sites/jobs.json").read_text()


@contextlib.contextmanager
def full(r: redis.Redis) -> Iterator[None]:
    """Redis above its maxmemory until the block ends."""
    before = r.config_get("maxmemory*")
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        yield
    finally:
        r.config_set("maxmemory", before["maxmemory"])
        r.config_set("maxmemory-policy", before["maxmemory-policy"])


def refusals(r: redis.Redis) -> int:
    """The errors Redis has answered since it started (INFO stats, Redis 6.2+: a script's OOM
    is an ERR there, an OOM on 7)."""
    return int(r.info("stats")["total_error_replies"])


def three_tasks_then_full(r: redis.Redis, keys: KeyLayout) -> None:
    for i in range(3):
        task = ExecTask.create(seed_id="s1", site_id="news", url=f"https://news.test/{i}")
        r.xadd(keys.stream, task.to_message())
    r.xgroup_create(keys.stream, GROUP, id="0")


def test_a_full_redis_refuses_a_read_in_a_multi_and_answers_it_plain(
        sync_redis: redis.Redis, namespace: str) -> None:
    keys = KeyLayout(namespace)
    three_tasks_then_full(sync_redis, keys)
    with full(sync_redis):
        with pytest.raises(redis.exceptions.OutOfMemoryError), \
                sync_redis.pipeline(transaction=True) as pipe:
            pipe.xlen(keys.stream)
            pipe.execute()

        def plan():  # type: ignore[no-untyped-def]
            (replies,) = yield [Batch([call("xlen", keys.stream)], transaction=True)]
            return replies

        assert run_sync(sync_redis, plan()) == [3]
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            sync_redis.set(f"{namespace}:x", 1)  # (a write is still refused: no fallback there)


def test_status_reads_a_full_redis_and_says_so(sync_redis: redis.Redis, redis_url: str,
                                               namespace: str) -> None:
    keys = KeyLayout(namespace)
    three_tasks_then_full(sync_redis, keys)
    with full(sync_redis):
        assert read_status(sync_redis, keys).backlog == 3
        code, out, err = run(redis_url, namespace, "status")
        assert code == 0, err
        assert "WARNING: Redis memory is at" in out
        code, out, err = run(redis_url, namespace, "status", "--json")
        assert code == 0, err
        shown = json.loads(out)
        assert shown["backlog"] == 3
        assert shown["redis_memory"]["near_limit"] is True
        assert shown["redis_memory"]["used_fraction"] > 1

        async def sample_and_count(client):  # type: ignore[no-untyped-def]
            sampled = await QueueSampler(redis_url, keys, client).sample()
            return sampled.backlog, await stream_counts(client, keys)

        backlog, counts = run_with_client(redis_url, sample_and_count)
    assert backlog == 3
    assert (counts[keys.stream].waiting, counts[keys.stream].pending) == (3, 0)


def test_workers_reload_pushed_rules_from_a_full_redis(sync_redis: redis.Redis,
                                                       namespace: str) -> None:
    keys = KeyLayout(namespace)
    config = parse_text(RULE, ".json", "jobs.json")
    RemoteRules(sync_redis, keys).push([Pushed(config, "jobs.json", RULE)])
    with full(sync_redis):
        [result] = RemoteRules(sync_redis, keys).changes({})
    assert result.error is None and result.config is not None
    assert result.config.site_id == "example_jobs"


@pytest.mark.e2e
def test_a_worker_pauses_while_redis_is_full_and_loses_nothing(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        demo_site: DemoSite) -> None:
    keys = KeyLayout(namespace)
    store = tmp_path / "items.db"
    enqueue(redis_url, namespace, [f"{demo_site.url}/slow/400?page={i}" for i in range(40)])
    worker = start_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=4,
                          METEORSEED_IDLE_CLOSE=5)
    wait_for(lambda: store.exists() and len(stored_docs(store)) >= 4, 60)
    with full(sync_redis):
        wait_for(lambda: "Redis is full" in worker.log(), 60)
        # Held full over several rounds of retries (refusals Redis itself counted): one line
        # for it all, whatever loops ran meanwhile without writing.
        refused = refusals(sync_redis)
        wait_for(lambda: refusals(sync_redis) >= refused + 10, 60)
    assert worker.wait(180) == 0, worker.log()[-3000:]
    log = worker.log()
    assert len(stored_docs(store)) == 40
    assert sync_redis.xlen(keys.stream) == 0 and sync_redis.xlen(keys.dead) == 0
    assert worker.stats()["meteorseed/acked"] == 40
    # One line for the whole time Redis was full, one when it had room again; no traceback.
    assert log.count("Redis is full") == 1, log[-3000:]
    assert log.count("Redis has room again") == 1, log[-3000:]
    assert "Redis unavailable" not in log and "Redis refused a command" not in log
    assert "Traceback" not in log
    assert worker.stats()["meteorseed/redis/full"] >= 1


@pytest.mark.e2e
def test_a_worker_stopped_while_redis_is_full_stops_cleanly_and_loses_nothing(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        demo_site: DemoSite) -> None:
    keys = KeyLayout(namespace)
    urls = [f"{demo_site.url}/slow/1500?page={i}" for i in range(12)]
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    enqueue(redis_url, namespace, urls)
    worker = start_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=4,
                          METEORSEED_IDLE_CLOSE=0, METEORSEED_CLAIM_IDLE=60)
    wait_for(lambda: sync_redis.xpending(keys.stream, keys.group)["pending"] > 0, 60, 0.05)
    with full(sync_redis):
        worker.signal(signal.SIGINT)
        assert worker.wait(90) == 0, worker.log()[-3000:]
    log = worker.log()
    assert "Scheduler close failure" not in log and "Traceback" not in log, log[-3000:]
    survivor = start_worker(tmp_path, redis_url, namespace, name="w2", CONCURRENT_REQUESTS=12,
                            METEORSEED_CLAIM_IDLE=60)
    assert survivor.wait(120) == 0, survivor.log()[-3000:]
    assert len(stored_docs(tmp_path / "items.db")) == len(urls)
    assert sync_redis.xlen(keys.stream) == 0 and sync_redis.xlen(keys.dead) == 0


def test_one_spell_whoever_meets_it_one_warning_each_way_short_waits(
        caplog: pytest.LogCaptureFixture) -> None:
    stats = MemoryStatsCollector(SimpleNamespace(settings=Settings()))
    state = RedisFull(stats)  # (not `full`: that is this file's helper filling Redis)
    oom = OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
    state.room()  # (nothing refused yet: nothing to say)
    with caplog.at_level(logging.DEBUG, "meteorseed_scrapy.queue.plumbing.redis_full"):
        waits = [state.failed(oom, where) for where in ("read", "ack", "breaker calls") * 20]
        assert state.refused == {"read", "ack", "breaker calls"}
        state.room()
        state.room()  # (said once per spell: a second loop finding room says nothing)
        waits.append(state.failed(oom, "gate calls"))  # a new spell
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m.split(" (")[0] for m in said] == [
        "Redis is full", "Redis has room again after 60 refused writes: worker resumed",
        "Redis is full"], said
    assert "during read" in said[0] and "during gate calls" in said[2]
    assert all(0 < wait <= RedisFull.MAX_DELAY_S for wait in waits), waits
    assert stats.get_value("meteorseed/redis/full") == 61
    assert state.failures == 1 and state.refused == {"gate calls"}


@contextlib.asynccontextmanager
async def counted_loop(redis_url: str, namespace: str, shared: RedisFull
                       ) -> AsyncIterator[tuple[list[int], AsyncRedis]]:
    """A worker's loops running one step ("read") that counts its runs (``[n]``), with their
    client, the step run once (the group set up) before the block."""
    steps = [0]

    async def step() -> None:
        steps[0] += 1
        await asyncio.sleep(0.005)

    client = async_client(redis_url, decode_responses=True)
    loops = Loops(StreamConsumer(client, KeyLayout(namespace), "w1"), shared.stats, shared)
    try:
        loops.start(step, "read")
        await wait_until(lambda: steps[0] >= 1)
        yield steps, client
    finally:
        loops.stopping = True
        await loops.cancel()
        await client.aclose()


async def refused_write(client: AsyncRedis, namespace: str) -> ResponseError:
    """What a full Redis answers a site's pause call."""
    with pytest.raises(ResponseError) as refused:
        await client.set(KeyLayout(namespace).site("a", "pause"), "1")
    return refused.value


def test_a_spell_site_calls_met_ends_when_a_loop_finds_room_not_before(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """Only a site call refused: the loops' steps that go through while Redis is still full
    (a ping, a read) end nothing; the first one after room came back does (seen as a second
    "Redis is full" on a loaded CI run when a breaker call that went through a still-full
    Redis ended the spell)."""
    stats = MemoryStatsCollector(SimpleNamespace(settings=Settings()))
    shared = RedisFull(stats)

    async def main() -> set[str]:
        async with counted_loop(redis_url, namespace, shared) as (steps, client):
            with full(sync_redis):
                SiteFaults("pause", stats, shared).failed("a", await refused_write(client,
                                                                                   namespace))
                done = steps[0]
                await wait_until(lambda: steps[0] >= done + 5)
                still = set(shared.refused)
            await wait_until(lambda: not shared.refused)
            return still

    with caplog.at_level(logging.DEBUG, "meteorseed_scrapy.queue.plumbing.redis_full"):
        assert asyncio.run(asyncio.wait_for(main(), 60)) == {"pause calls"}
    said = [r.getMessage() for r in caplog.records if r.name == RedisFull.__module__
            and r.levelno >= logging.WARNING]
    assert [m.split(" (")[0] for m in said] == [
        "Redis is full", "Redis has room again after 1 refused writes: worker resumed"], said


def info_calls(r: redis.Redis) -> int:
    """The INFO commands Redis had answered before this one (INFO commandstats)."""
    return int(r.info("commandstats").get("cmdstat_info", {}).get("calls", 0))


def test_a_full_redis_is_asked_for_room_once_per_check_interval_and_at_the_stop(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While Redis is full, the loops' steps that go through ask it ``INFO memory`` at most
    once per :attr:`Loops.ROOM_CHECK_S` (here an hour, so that no clock decides the count):
    twenty steps, one question. The stop asks once more, and finds the room made meanwhile."""
    monkeypatch.setattr(Loops, "ROOM_CHECK_S", 3600.0)
    shared = RedisFull(MemoryStatsCollector(SimpleNamespace(settings=Settings())))

    async def main() -> tuple[int, int, set[str]]:
        async with counted_loop(redis_url, namespace, shared) as (steps, client):
            with full(sync_redis):
                shared.failed(await refused_write(client, namespace), "pause calls")
                asked, done = info_calls(sync_redis), steps[0]
                await wait_until(lambda: steps[0] >= done + 20)
                during = info_calls(sync_redis) - asked - 1  # (less the count's own INFO)
            asked = info_calls(sync_redis)
            await wait_until(lambda: steps[0] >= done + 40)
            return during, info_calls(sync_redis) - asked - 1, set(shared.refused)

    # (without the interval: one INFO per step, 20 and 20)
    assert asyncio.run(asyncio.wait_for(main(), 60)) == (1, 0, {"pause calls"})
    assert not shared.refused  # the stop asked, and Redis had room

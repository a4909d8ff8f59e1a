"""METEORSEED_STREAM_SHARDS on one Redis: the key layout, the writer and the consumer across
shards, deferral per shard, and real workers (the cluster itself: tests/test_cluster_shards.py)."""

from __future__ import annotations

import io
import json
import zlib
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from redis.asyncio import Redis

from meteorseed_scrapy.cli import main as cli_main
from meteorseed_scrapy.queue.consume.acks import Completion, TaskRecords
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.group import ConsumerGroup
from meteorseed_scrapy.queue.enqueue.enqueue_calls import CHUNK_SIZE
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout, shard_of
from meteorseed_scrapy.queue.shards import ShardMismatch
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import start_worker, stored_docs
from tests.queue_helpers import is_seen, touch
from tests.test_consumer import arun

T = TypeVar("T")
SHARDS = 4


def sites_covering(shards: int) -> list[str]:
    """Site ids, one in every shard."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < shards:
        found.setdefault(shard_of(f"site{i}", shards), f"site{i}")
        i += 1
    return [found[k] for k in range(shards)]


def task(site: str, n: int, priority: int = 0) -> ExecTask:
    return ExecTask.create(seed_id="s1", site_id=site, url=f"https://{site}.example/p/{n}",
                           priority=priority)


def test_one_shard_keeps_the_historical_key_names() -> None:
    keys = KeyLayout("ns")
    assert (keys.stream, keys.dead, keys.delayed) == ("ns:tasks", "ns:dead", "ns:delayed")
    assert (keys.done("t"), keys.failed("t")) == ("ns:done:t", "ns:failed:t")
    assert keys.seen("news") == "ns:seen:{news}"
    assert keys.task_stream("realtime", "high") == "ns:tasks:realtime:high"
    assert (keys.seeds, keys.seed("a"), keys.sites) == ("ns:seeds", "ns:seed:a", "ns:sites")
    assert keys.deads == ("ns:dead",)


def test_shards_tag_every_key_a_task_touches_and_a_cluster_tags_the_registry() -> None:
    keys = KeyLayout("ns", SHARDS)
    shard = keys.for_site("news")
    k = zlib.crc32(b"news") % SHARDS
    assert shard.index == k == shard_of("news", SHARDS)
    assert shard.stream == f"ns:{{s{k}}}:tasks"
    assert shard.task_stream("retry", "low") == f"ns:{{s{k}}}:tasks:retry:low"
    assert (shard.dead, shard.delayed) == ("ns:dead", f"ns:{{s{k}}}:delayed")  # one Redis
    assert shard.done("t") == f"ns:{{s{k}}}:done:t"
    assert keys.seen("news") == f"ns:{{s{k}}}:seen:news"
    assert len(keys.streams) == 9 * SHARDS and keys.deads == ("ns:dead",) == (keys.dead,)
    assert keys.shard_of_stream(shard.task_stream("realtime", "normal")) == shard
    assert keys.seeds == "ns:seeds"  # one Redis: the registry keeps its names
    with pytest.raises(ValueError, match="METEORSEED_STREAM_SHARDS=4"):
        _ = keys.stream  # which shard? it depends on the site
    on_cluster = KeyLayout("ns", SHARDS, cluster=True)
    assert on_cluster.for_site("news").dead == f"ns:{{s{k}}}:dead"
    assert len(on_cluster.deads) == SHARDS
    with pytest.raises(ValueError, match="METEORSEED_STREAM_SHARDS=4"):
        _ = on_cluster.dead
    cluster = KeyLayout("ns", 1, cluster=True)
    assert (cluster.stream, cluster.dead) == ("ns:{s0}:tasks", "ns:{s0}:dead")
    assert (cluster.seeds, cluster.seed("a"), cluster.seeds_due) == (
        "ns:{seeds}", "ns:{seeds}:seed:a", "ns:{seeds}:due")
    assert (cluster.sites, cluster.sites_rev) == ("ns:{sites}", "ns:{sites}:rev")
    assert cluster.site_own("a", "host", "breaker") == "ns:{host}:site:a:breaker"
    assert cluster.site_own("a", "a", "breaker") == "ns:{a}:breaker"
    with pytest.raises(ValueError, match="METEORSEED_STREAM_SHARDS"):
        KeyLayout("ns", 0)


def test_writer_and_consumer_across_shards(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace, SHARDS)
    sites = sites_covering(SHARDS)
    per_site = CHUNK_SIZE + 20  # more than one script call per stream
    tasks = [task(site, n, priority=n % 3 - 1) for site in sites for n in range(per_site)]

    async def body(client: Redis) -> dict[str, Any]:
        writer = TaskWriter(client, keys)
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        out: dict[str, Any] = {"first": await writer.add(tasks)}
        out["again"] = await writer.add(tasks[:10] + tasks[-10:])
        out["backlog"] = await writer.backlog()
        got = []
        while batch := await consumer.read(300, 0):
            got += batch
        out["got"] = got
        out["shards_read"] = {keys.shard_of_stream(d.stream).index for d in got}
        # Every delivery's stream is its site's shard.
        out["in_own_shard"] = all(keys.shard_of_stream(d.stream) == keys.for_site(
            d.task.site_id) for d in got if d.task)
        out["lost"] = await touch(consumer, [d.ref for d in got])
        dead, rest = got[0], got[1:]
        assert dead.task is not None
        await consumer.dead_letter(dead, "gave up", writer.encode(dead.task).fingerprint.hex())
        out["released"] = not await is_seen(writer, dead.task)
        done = [(d.task, '{"outcome": "done"}') for d in rest[:50] if d.task]
        out["acked"] = await consumer.complete([d.ref for d in rest], 60,
                                                 done=[Completion(t, r) for t, r in done])
        records = TaskRecords(client, keys)
        out["records"] = await records.completion_records([t for t, _ in done])
        await records.note_failures([(t, "why") for t, _ in done[:3]], 60)
        out["notes"] = await records.failure_notes([t for t, _ in done[:3]])
        out["quiet"] = await ConsumerGroup(client, keys, "w1").namespace_quiet()
        return out

    out = arun(redis_url, body)
    total = len(tasks)
    assert (out["first"].enqueued, out["first"].duplicates) == (total, 0)
    assert (out["again"].enqueued, out["again"].duplicates) == (0, 20)
    assert out["backlog"] == total
    assert len(out["got"]) == total
    assert len({d.task.task_id for d in out["got"]}) == total
    assert out["shards_read"] == set(range(SHARDS))
    assert out["in_own_shard"] and out["lost"] == []
    assert out["released"]
    assert out["acked"] == total - 1
    assert out["records"] == ['{"outcome": "done"}'] * 50
    assert len(out["notes"]) == 3
    assert out["quiet"]
    assert sync_redis.xlen(f"{namespace}:dead") == 1  # one Redis: the one dead-letter stream


def test_dead_letters_of_every_shard_share_ns_dead_and_requeue_to_their_shard(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace, SHARDS)
    sites = sites_covering(SHARDS)

    async def body(client: Redis) -> None:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()  # records the shard count for the CLI
        await TaskWriter(client, keys).add([task(site, 1, priority=1) for site in sites])
        for delivery in await consumer.read(100, 0):
            await consumer.dead_letter(delivery, "gave up")

    arun(redis_url, body)
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(["status", "--json", "--redis-url", redis_url, "--namespace", namespace],
                    stdout=out, stderr=err)
    status = json.loads(out.getvalue())
    assert (code, status["dead"], len(status["shards"])) == (0, SHARDS, SHARDS)
    out = io.StringIO()
    code = cli_main(["dead", "requeue", "--all", "--json", "--redis-url", redis_url,
                     "--namespace", namespace], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert len(json.loads(out.getvalue())["requeued"]) == SHARDS
    assert sync_redis.xlen(keys.dead) == 0
    for site in sites:  # each back in its own shard, lane and band
        [(_, fields)] = sync_redis.xrange(keys.for_site(site).stream_for("scheduled", 1))
        assert json.loads(fields["t"])["site_id"] == site


def test_reclaim_touch_hand_back_and_defer_per_shard(redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace, SHARDS)
    sites = sites_covering(SHARDS)

    async def body(client: Redis) -> dict[str, Any]:
        a = StreamConsumer(client, keys, "a")
        b = StreamConsumer(client, keys, "b")
        await a.ensure_group()
        await TaskWriter(client, keys).add([task(s, n) for s in sites for n in range(3)])
        mine = await a.read(100, 0)
        out: dict[str, Any] = {"read": len(mine)}
        taken = await b.reclaim(0, 5)  # from several shards, at most 5
        out["taken"] = len(taken)
        out["lost"] = {ref for ref in await touch(a, [d.ref for d in mine])}
        out["taken_refs"] = {d.ref for d in taken}
        out["handed"] = await b.hand_back(taken, 3600)
        gate = DelayedSet(client, keys)
        kept = [d for d in mine if d.ref not in out["taken_refs"]]
        for d in kept[:4]:
            assert d.task is not None
            assert await gate.defer(d.ref, d.task, 0)
        out["delayed"] = sum([await client.zcard(s.delayed) for s in keys.shard_keys])
        out["wait"] = await gate.promote()
        out["back"] = await a.read(100, 0)
        out["deferred"] = kept[:4]
        return out

    out = arun(redis_url, body)
    assert out["read"] == 3 * SHARDS
    assert out["taken"] == 5
    assert out["lost"] == out["taken_refs"]
    assert out["handed"] == 5
    assert out["delayed"] == 4 and out["wait"] == -1.0
    back = {d.task.task_id: d for d in out["back"] if d.task}
    for d in out["deferred"]:  # promoted into the stream of their own shard
        assert keys.shard_of_stream(back[d.task.task_id].stream) == keys.shard_of_stream(
            d.stream)


@pytest.mark.e2e
def test_workers_crawl_a_sharded_namespace_and_a_different_count_is_refused(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    demo_site.reset()
    keys = KeyLayout(namespace, SHARDS)
    sites = sites_covering(SHARDS)
    hubs = [ExecTask.create(seed_id="s1", site_id=site, url=f"{demo_site.url}/links/6")
            for site in sites]

    async def body(client: Redis) -> None:
        await TaskWriter(client, keys).add(hubs)

    arun(redis_url, body)
    workers = [start_worker(tmp_path, redis_url, namespace, name=f"w{i}",
                            spider_args={"follow": "1"}, METEORSEED_STREAM_SHARDS=SHARDS,
                            METEORSEED_SITE_RATE=100, METEORSEED_SITE_BURST=20)
               for i in (1, 2)]
    for worker in workers:
        assert worker.wait(180) == 0, worker.log()[-3000:]
    docs = stored_docs(tmp_path / "items.db")
    # Each site: its hub and the hub's 6 children (links found twice are deduplicated).
    assert {doc_id.split(":", 1)[0] for doc_id in docs} == set(sites)
    assert len(docs) == 7 * SHARDS
    for stream in keys.streams:
        assert sync_redis.xlen(stream) == 0, stream
    assert sum(w.stats().get("meteorseed/children/duplicates", 0) for w in workers) > 0

    other = start_worker(tmp_path, redis_url, namespace, name="w3", METEORSEED_STREAM_SHARDS=2)
    assert other.wait(120) != 0  # the spider does not open
    assert "METEORSEED_STREAM_SHARDS=2" in other.log()
    assert str(ShardMismatch.__name__) in other.log()

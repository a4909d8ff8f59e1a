"""Redis Cluster groundwork against a real local cluster of three masters.

What is slot-safe already (the per-site politeness scripts, the dedup scripts with every key they
build inside Lua) runs here through its Python API; what is not is listed in docs/cluster.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.consume.acks import Completion
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.enqueue.enqueue_calls import CHUNK_SIZE, AddResult
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import (
    async_client,
    is_cluster_url,
    parse_cluster_url,
    sync_client,
)
from meteorseed_scrapy.settings import FeedConfig
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.cluster import SLOTS, LocalCluster
from tests.queue_helpers import is_seen
from tests.queue_helpers import paused_for as pause_left

T = TypeVar("T")
DAY = 86400
T0 = (int(time.time()) // DAY + 30) * DAY  # a future generation start (keys get EXPIREAT)


def run(url: str, body: Callable[[Any], Awaitable[T]], **options: Any) -> T:
    async def main() -> T:
        client = async_client(url, **options)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def namespace_keys(url: str, ns: str) -> list[str]:
    client = sync_client(url, decode_responses=True)
    try:
        return sorted(client.scan_iter(match=f"{ns}:*", count=1000, target_nodes="all"))
    finally:
        client.close()


def sites_on_distinct_nodes(cluster: LocalCluster, count: int) -> list[str]:
    """Site ids whose ``{site}`` keys live on ``count`` different masters."""
    client = sync_client(cluster.url)
    try:
        by_node: dict[str, str] = {}
        for i in range(1000):
            node = client.get_node_from_key(f"x:{{site{i}}}").name
            by_node.setdefault(node, f"site{i}")
            if len(by_node) == count:
                return list(by_node.values())
    finally:
        client.close()
    raise AssertionError("sites did not spread over the nodes")


# -- the local cluster and the client factory -----------------------------------------------
def test_the_local_cluster_has_three_masters_sharing_every_slot(cluster: LocalCluster) -> None:
    for port in cluster.ports:
        info = cluster.cluster_info(port)
        assert info["cluster_state"] == "ok"
        assert info["cluster_size"] == "3"
        assert info["cluster_slots_assigned"] == str(SLOTS)
    client = sync_client(cluster.url)
    try:
        masters = {n.name for n in client.get_primaries()}
        assert len(masters) == 3
        assert len(sites_on_distinct_nodes(cluster, 3)) == 3
    finally:
        client.close()


def test_a_cluster_url_gives_cluster_clients_and_a_plain_url_plain_ones(
    cluster: LocalCluster, redis_url: str
) -> None:
    assert is_cluster_url(cluster.url) and not is_cluster_url(redis_url)
    one_node = f"redis+cluster://127.0.0.1:{cluster.ports[1]}"  # the rest is discovered
    client = sync_client(one_node, decode_responses=True)
    try:
        assert isinstance(client, redis.RedisCluster)
        for i in range(30):  # keys on every node, through one start node
            client.set(f"factory:{i}", i)
        assert [client.get(f"factory:{i}") for i in range(30)] == [str(i) for i in range(30)]
        assert len({client.get_node_from_key(f"factory:{i}").name for i in range(30)}) == 3
    finally:
        client.close()
    plain = sync_client(redis_url)
    try:
        assert type(plain) is redis.Redis and plain.ping()
    finally:
        plain.close()

    async def body(client: Any) -> tuple[type, str | None]:
        return type(client), await client.get("factory:7")

    kind, value = run(cluster.url, body, decode_responses=True, socket_timeout=5,
                      socket_connect_timeout=5, health_check_interval=15)
    assert kind is redis.asyncio.RedisCluster and value == "7"


def test_cluster_urls_are_parsed_and_bad_ones_name_the_setting() -> None:
    target = parse_cluster_url("rediss+cluster://u:p%40ss@h1:7000,h2:7001/0?socket_timeout=3")
    assert target.nodes == (("h1", 7000), ("h2", 7001))
    assert target.node_url == "rediss://u:p%40ss@h1:7000/0?socket_timeout=3"
    assert parse_cluster_url("redis+cluster://[::1]:7000").node_url == "redis://[::1]:7000/0"
    for bad, why in [("redis+cluster://h1:7000/2", "database 0 only"),
                     ("redis+cluster://h1", "'h1' is not host:port"),
                     ("redis+cluster://h1:7000,h2:x", "'h2:x' is not host:port"),
                     ("redis://h1:7000", "not a cluster URL")]:
        with pytest.raises(ValueError, match="METEORSEED_REDIS_URL") as err:
            parse_cluster_url(bad)
        assert why in str(err.value)


# -- per-site politeness: every key of a script call carries the site's hash tag --------------
def test_the_site_gate_works_on_a_cluster_for_sites_on_different_nodes(
    cluster: LocalCluster, ns: str
) -> None:
    sites = sites_on_distinct_nodes(cluster, 3)
    limits = SiteLimits(rate=1.0, burst=3, concurrency=2)

    async def body(client: Any) -> dict[str, Any]:
        gate = SiteGate(client, KeyLayout(ns), lambda _s: limits, "c1", Backoff(1.0, 300.0))
        out: dict[str, Any] = {}
        for site in sites:
            first = await gate.acquire(site, 5)  # capped by concurrency
            await gate.renew({site: first.lease_ids})
            await gate.release([(site, first.lease_ids[0])])
            again = await gate.acquire(site, 5)  # one lease back, one token left
            paused = await gate.pause(site, retry_after=30)
            out[site] = (len(first.lease_ids), len(again.lease_ids), paused.strikes,
                         await pause_left(gate, site), len((await gate.acquire(site, 1)).lease_ids))
        return out

    result = run(cluster.url, body, decode_responses=True)
    for site in sites:
        granted, regranted, strikes, paused_for, while_paused = result[site]
        assert (granted, regranted, strikes, while_paused) == (2, 1, 1, 0)
        assert 0 < paused_for <= 30 * (1 + Backoff().jitter)  # Retry-After plus jitter
    slots = {key_slot(k.encode()) for k in namespace_keys(cluster.url, ns)}
    assert slots == {key_slot(f"{{{s}}}".encode()) for s in sites}


def test_the_breaker_reports_health_per_site_on_a_cluster(cluster: LocalCluster, ns: str) -> None:
    sites = sites_on_distinct_nodes(cluster, 2)
    config = BreakerConfig(window=60, min_requests=4, error_ratio=0.3, max_latency=30.0,
                           probe_interval=60.0)

    class Stats:
        def __init__(self) -> None:
            self.values: dict[str, int] = {}

        def inc_value(self, key: str, n: int = 1) -> None:
            self.values[key] = self.values.get(key, 0) + n

    stats = Stats()

    async def body(client: Any) -> dict[str, str]:
        breaker = Breaker(client, KeyLayout(ns), config, stats)
        for i in range(8):  # the first site fails on distinct tasks, the second is healthy
            breaker.record(sites[0], True, 0.1, False, task_id=f"t{i}")
            breaker.record(sites[1], False, 0.1, False, task_id=f"u{i}")
        await breaker.flush()
        return dict(breaker.state)

    state = run(cluster.url, body, decode_responses=True)
    assert state == {sites[0]: "open", sites[1]: "closed"}
    assert stats.values == {f"meteorseed/breaker/{sites[0]}/open": 1}


# -- URL dedup: every key dedup_lib.lua builds stays in the dedup root's slot -----------------
class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_dedup_scripts_keep_every_key_in_the_site_slot_on_a_cluster(
    cluster: LocalCluster, ns: str
) -> None:
    site = sites_on_distinct_nodes(cluster, 3)[2]
    keys = KeyLayout(ns, cluster=True)  # one shard, tagged: its stream in the root's slot
    clock = Clock(T0 + 100)
    urls = [f"https://example.com/{site}/{i}" for i in range(1500)]

    def tasks(batch: list[str], window: int | None = None) -> list[ExecTask]:
        meta: dict[str, Any] = {} if window is None else {"recrawl_after": window}
        return [ExecTask.create(seed_id="s", site_id=site, url=u, meta=meta) for u in batch]

    async def add(writer: TaskWriter, batch: list[ExecTask]) -> AddResult:
        # More than CHUNK_SIZE tasks: several script calls, sent concurrently on a cluster
        # (redis-py's cluster pipeline refuses EVALSHA).
        assert len(batch) > CHUNK_SIZE
        return await writer.add(batch)

    async def body(client: Any) -> dict[str, Any]:
        writer = TaskWriter(client, keys, clock=clock)
        out: dict[str, Any] = {"first": await add(writer, tasks(urls, DAY))}
        clock.now = T0 + DAY + 50  # the next generation: the previous one answers
        out["again"] = await add(writer, tasks(urls))
        out["new"] = await writer.add(tasks([f"https://example.com/{site}/new/{i}"
                                             for i in range(10)]))
        probe = tasks(urls[:1])[0]
        out["seen"] = await is_seen(writer, probe, clock.now)
        out["released"] = await writer.release(probe)
        out["seen_after"] = await is_seen(writer, probe, clock.now)
        out["backlog"] = await writer.backlog()  # MULTI of XLEN + XPENDING in one slot
        return out

    out = run(cluster.url, body)
    assert (out["first"].enqueued, out["first"].duplicates) == (1500, 0)
    assert (out["again"].enqueued, out["again"].duplicates) == (0, 1500)
    assert out["new"].enqueued == 10
    assert (out["seen"], out["released"], out["seen_after"]) == (True, True, False)
    assert out["backlog"] == 1510
    # (the seed's started event and its once-only marker are in the events stream's slot)
    found = [k for k in namespace_keys(cluster.url, ns)
             if k != keys.shard_count and not k.startswith(keys.events)]
    assert len(found) > 20, found  # generations and split buckets were made
    assert {key_slot(k.encode()) for k in found} == {key_slot(keys.seen(site).encode())}


def test_a_task_in_another_shards_stream_gets_its_record_only_after_its_ack_script(
    cluster: LocalCluster, ns: str
) -> None:
    # A task put in another shard's stream than its site's (by hand, or by an older layout):
    # its completion record lives in another slot, so it cannot go in the ack script. Written
    # ahead of the script, a refused script (the feed's XADD) would leave the task pending
    # with a record, and its redelivery acked without a refetch: its feed entries never in.
    keys = KeyLayout(ns, shards=2, cluster=True)
    site = next(f"site{i}" for i in range(100) if keys.for_site(f"site{i}").index == 0)
    other = keys.shard_keys[1]
    task = ExecTask.create(seed_id="s", site_id=site, url=f"https://{site}.example/1")
    record_key = keys.for_site(site).done(task.task_id)
    entry = {"_id": f"{site}:1", "task_id": task.task_id}

    async def body(client: Any) -> dict[str, Any]:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await client.xadd(other.stream, task.to_message())
        (delivery,) = await consumer.read(10, 100)
        done = [Completion(task, '{"outcome": "ok"}', (entry,))]
        await client.set(other.items_feed, "not a stream")  # the script's XADD is refused
        out: dict[str, Any] = {}
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await consumer.complete([delivery.ref], 60, done=done, feed=FeedConfig("ids"))
        out["refused"] = (await client.get(record_key),
                          (await client.xpending(other.stream, keys.group))["pending"])
        await client.delete(other.items_feed)
        out["acked"] = await consumer.complete([delivery.ref], 60, done=done,
                                               feed=FeedConfig("ids"))
        out["after"] = (await client.get(record_key),
                        (await client.xpending(other.stream, keys.group))["pending"],
                        [f["_id"] for _, f in await client.xrange(other.items_feed)])
        return out

    out = run(cluster.url, body, decode_responses=True)
    assert out["refused"] == (None, 1)
    assert out["acked"] == 1
    assert out["after"] == ('{"outcome": "ok"}', 0, [f"{site}:1"])

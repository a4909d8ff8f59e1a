"""Stream shards on a real local Redis Cluster of three masters: a worker, seed-expand, the
dead-letter CLI and status, every one with ``redis+cluster://`` and METEORSEED_STREAM_SHARDS."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy_redis.queue import PriorityQueue

from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout, shard_of
from meteorseed_scrapy.queue.plumbing.connection import async_client, sync_client
from meteorseed_scrapy.queue.shards import ShardMismatch, check_shard_count
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.seeder import Seeder, SeederConfig
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.testing.cluster import LocalCluster
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.api_helpers import ApiServer, Client, url_list
from tests.cli_helpers import cli_json
from tests.e2e_helpers import REPO, start_worker, stored_docs
from tests.subprocess_env import python_path
from tests.test_migrate_cli import seed_expand
from tests.test_shards import sites_covering

pytestmark = pytest.mark.e2e
SHARDS = 6


def enqueue(url: str, keys: KeyLayout, tasks: list[ExecTask]) -> None:
    async def run() -> None:
        client = async_client(url, decode_responses=True)
        try:
            await TaskWriter(client, keys).add(tasks)
        finally:
            await client.aclose()

    asyncio.run(run())


def test_worker_on_cluster_with_shards_stores_everything_once_and_spreads_the_streams(
    tmp_path: Path, cluster: LocalCluster, ns: str, demo_site: DemoSite
) -> None:
    keys = KeyLayout(ns, SHARDS, cluster=True)
    sites = sites_covering(SHARDS)
    tasks = [ExecTask.create(seed_id="s1", site_id=site, url=f"{demo_site.url}/news/article/{i}")
             for n, site in enumerate(sites) for i in range(n * 5 + 1, n * 5 + 9)]
    broken = ExecTask.create(seed_id="s1", site_id=sites[3], url=f"{demo_site.url}/status/500")
    enqueue(cluster.url, keys, [*tasks, broken])

    client = sync_client(cluster.url, decode_responses=True)
    try:
        # Every shard's stream holds its sites' tasks; the six shards span all three masters.
        nodes = {client.get_node_from_key(shard.stream).name for shard in keys.shard_keys}
        assert len(nodes) == 3
        for shard in keys.shard_keys:
            assert client.xlen(shard.stream) > 0, shard.stream
            slot = client.cluster_keyslot(shard.stream)
            for key in (shard.dead, shard.delayed, shard.done("x"), shard.failed("x"),
                        shard.items_feed,
                        *shard.streams, *(shard.seen(s) for s in sites
                                          if keys.for_site(s) == shard)):
                assert client.cluster_keyslot(key) == slot, key

        worker = start_worker(tmp_path, cluster.url, ns, METEORSEED_STREAM_SHARDS=SHARDS,
                              METEORSEED_SITE_RATE=100, METEORSEED_SITE_BURST=20,
                              METEORSEED_MAX_DELIVERIES=1, METEORSEED_ITEMS_FEED="ids")
        assert worker.wait(180) == 0, worker.log()[-3000:]

        docs = stored_docs(tmp_path / "items.db")
        assert set(docs) == {f"{t.site_id}:{t.url[len(demo_site.url):]}" for t in tasks}
        # The items feed, written by the ack scripts of a cluster too: one per shard, in its
        # slot.
        assert len(keys.items_feeds) == SHARDS
        assert {f["_id"] for feed in keys.items_feeds
                for _, f in client.xrange(feed)} == set(docs)
        assert worker.stats()["meteorseed/acked"] == len(tasks)
        for shard in keys.shard_keys:  # nothing waiting or pending anywhere
            for stream in shard.streams:
                assert client.xlen(stream) == 0, stream
        # The broken task's dead letter is in its site's shard.
        dead_shard = keys.for_site(sites[3])
        assert [client.xlen(shard.dead) for shard in keys.shard_keys] == [
            1 if shard == dead_shard else 0 for shard in keys.shard_keys]

        # The seed's progress: one hash per shard, summed; the end judged over all of them.
        code, shown = cli_json(cluster.url, ns, "seeds", "show", "s1", "--json")
        assert code == 0, shown
        progress = shown["progress"]
        assert (progress["state"], progress["done"], progress["dead"], progress["items"]) == (
            "finished", len(tasks), 1, len(tasks))
        assert {f["seed"] for _, f in client.xrange(keys.events)
                if f["event"] == "finished"} == {"s1"}
        code, status = cli_json(cluster.url, ns, "status", "--json")
        assert code == 0, status
        assert (status["backlog"], status["pending"], status["dead"]) == (0, 0, 1)
        assert len(status["shards"]) == SHARDS  # the recorded count, no setting needed
        assert status["seen"][sites[0]] == 8

        code, letters = cli_json(cluster.url, ns, "dead", "list", "--json")
        assert code == 0, letters
        [letter] = letters
        assert letter["id"].startswith(f"{dead_shard.index}:")
        assert letter["url"] == broken.url
        code, shown = cli_json(cluster.url, ns, "dead", "requeue", "--all", "--json")
        assert code == 0, shown
        assert [r["task_id"] for r in shown["requeued"]] == [broken.task_id]
        assert client.xlen(dead_shard.dead) == 0
        assert client.xlen(dead_shard.stream) == 1
        code, status = cli_json(cluster.url, ns, "status", "--json")
        assert (status["backlog"], status["dead"]) == (1, 0)
        # reset: SCAN on every master, UNLINK split per slot.
        code, reset = cli_json(cluster.url, ns, "reset", "--json", "--yes")
        assert code == 0 and reset["deleted"] > 6 * 9, reset
        assert list(client.scan_iter(match=f"{ns}:*", target_nodes="all")) == []
    finally:
        client.close()


def test_seed_expand_on_cluster_deduplicates_across_runs(
    tmp_path: Path, cluster: LocalCluster, ns: str
) -> None:
    sites = sites_covering(SHARDS)
    lines = [json.dumps({"seed_id": f"seed-{site}", "site_id": site, "task_type": "url_list",
                         "payload": {"urls": [f"https://{site}.example/p/{i}"
                                              for i in range(700 if n == 0 else 30)]}})
             for n, site in enumerate(sites)]
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(lines) + "\n")
    total = 700 + 30 * (len(sites) - 1)
    env = dict(os.environ, PYTHONPATH=python_path(REPO))
    env.pop("SCRAPY_SETTINGS_MODULE", None)

    def expand() -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "scrapy.cmdline", "seed-expand", str(seeds),
             "-s", f"METEORSEED_REDIS_URL={cluster.url}", "-s", f"METEORSEED_NAMESPACE={ns}",
             "-s", f"METEORSEED_STREAM_SHARDS={SHARDS}"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().splitlines()[-1]

    assert expand() == f"read {len(sites)} lines, enqueued {total}, duplicates 0, rejected 0"
    assert expand() == f"read {len(sites)} lines, enqueued 0, duplicates {total}, rejected 0"
    proc = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "seed-expand", str(seeds),
         "-s", f"METEORSEED_REDIS_URL={cluster.url}", "-s", f"METEORSEED_NAMESPACE={ns}",
         "-s", "METEORSEED_STREAM_SHARDS=3"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "METEORSEED_STREAM_SHARDS=3" in proc.stderr and "Traceback" not in proc.stderr
    keys = KeyLayout(ns, SHARDS, cluster=True)
    client = sync_client(cluster.url, decode_responses=True)
    try:
        lengths = {k: client.xlen(shard.stream) for k, shard in enumerate(keys.shard_keys)}
        assert sum(lengths.values()) == total
        assert lengths[shard_of(sites[0], SHARDS)] == 700
    finally:
        client.close()


def test_a_different_shard_count_is_refused(cluster: LocalCluster, ns: str) -> None:
    async def run() -> str:
        client = async_client(cluster.url, decode_responses=True)
        try:
            await check_shard_count(client, KeyLayout(ns, 4, cluster=True))
            await check_shard_count(client, KeyLayout(ns, 4, cluster=True))  # the same: fine
            with pytest.raises(ShardMismatch) as err:
                await check_shard_count(client, KeyLayout(ns, 6, cluster=True))
            return str(err.value)
        finally:
            await client.aclose()

    message = asyncio.run(run())
    assert "METEORSEED_STREAM_SHARDS=6" in message and "4 shard(s)" in message


def test_sites_sharing_a_quota_key_pass_the_gate_and_breaker_on_cluster(
    cluster: LocalCluster, ns: str
) -> None:
    keys = KeyLayout(ns, SHARDS, cluster=True)
    limits = SiteLimits(rate=50.0, burst=10, concurrency=10, quota_key="shared-host")
    sites = sites_covering(3)  # their own {site} tags would be on other slots

    class Stats:
        def inc_value(self, key: str, n: int = 1) -> None:
            pass

    async def body(client: Any) -> tuple[list[int], dict[str, str]]:
        gate = SiteGate(client, keys, lambda _s: limits, "c1", Backoff(1.0, 300.0))
        granted = [len((await gate.acquire(site, 3)).lease_ids) for site in sites]
        breaker = Breaker(client, keys, BreakerConfig(min_requests=4), Stats(),
                          lambda site: limits.quota(site))
        for i in range(8):
            breaker.record(sites[0], True, 0.1, False, task_id=f"t{i}")
        await breaker.flush()
        return granted, dict(breaker.state)

    granted, state = asyncio.run(_with_client(cluster.url, body))
    assert granted == [3, 3, 3]  # one bucket of 10 for the three sites: 9 taken
    assert state[sites[0]] == "open"
    client = sync_client(cluster.url, decode_responses=True)
    try:
        slot = client.cluster_keyslot(keys.site("shared-host", "bucket"))
        assert client.cluster_keyslot(keys.site_own(sites[0], "shared-host", "breaker")) == slot
        assert client.exists(keys.site_own(sites[0], "shared-host", "breaker")) == 1
    finally:
        client.close()


async def _with_client(url: str, body: Any) -> Any:
    client = async_client(url, decode_responses=True)
    try:
        return await body(client)
    finally:
        await client.aclose()


def test_seed_registry_and_site_rules_on_cluster(cluster: LocalCluster, ns: str) -> None:
    keys = KeyLayout(ns, SHARDS, cluster=True)
    seeds = [SeedTask(seed_id=f"seed{i}", site_id=f"site{i}", task_type="url_list",
                      payload={"urls": [f"https://site{i}.example/"]}, schedule="every 30m")
             for i in range(5)]

    async def body(client: Any) -> dict[str, Any]:
        registry = SeedRegistry(client, keys)
        for seed in seeds:
            await registry.put(seed)  # seed_put.lua: the seed, the index, by-site, due
        claimed = await registry.claim_due(None, 10, 60)
        await registry.add_yield({"seed0": 4, "unknown": 2})  # seed_yield.lua
        record = await registry.record_run("seed0", started_at=time.time(), ok=True,
                                           error=None, new_urls=1, duplicates=0, rejected=0)
        deleted = await registry.delete("seed4")  # seed_delete.lua
        return {"claimed": len(claimed), "record": record, "deleted": deleted,
                "count": await registry.count()}

    out = asyncio.run(_with_client(cluster.url, body))
    assert out["claimed"] == 5 and out["deleted"] and out["count"] == 4
    assert out["record"] is not None and out["record"].runs == 1
    client = sync_client(cluster.url, decode_responses=True)
    try:
        rules = RemoteRules(client, keys)
        client.hset(keys.sites, "gone", "{}")
        assert rules.remove(["gone"]) == 1  # MULTI of HDEL + INCR in the {sites} slot
        assert client.get(keys.sites_rev) == "1"
        slots = {client.cluster_keyslot(k) for k in (
            keys.seeds, keys.seeds_by_site, keys.seeds_due, keys.seeds_yield, keys.seed("seed0"))}
        assert len(slots) == 1
    finally:
        client.close()


def test_serve_dispatches_and_reports_on_cluster(cluster: LocalCluster, ns: str,
                                                 api_server: ApiServer) -> None:
    sites = sites_covering(SHARDS)
    with api_server(redis_url=cluster.url, namespace=ns, shards=SHARDS) as server:
        api = Client(server.url)
        seeds = [url_list(f"seed-{site}", [f"https://{site}.example/{i}" for i in range(3)],
                          site_id=site) for site in sites]
        status, _, body = api.call("POST", "/dispatch", seeds)
        assert status == 202 and body["enqueued"] == 3 * SHARDS, body
        status, _, body = api.call("POST", "/dispatch", seeds)
        assert status == 202 and body["duplicates"] == 3 * SHARDS, body
        status, _, overview = api.call("GET", "/status")
        assert status == 200, overview
        assert overview["backlog"] == 3 * SHARDS and overview["dead"] == 0
        assert overview["lanes"]["realtime"]["backlog"] == 3 * SHARDS
        for path in ("/sites", "/seeds", "/dead-letters"):
            status, _, body = api.call("GET", path)
            assert status == 200, (path, body)


def test_scrapy_redis_migration_on_cluster(tmp_path: Path, cluster: LocalCluster,
                                           ns: str) -> None:
    client = sync_client(cluster.url)
    try:
        queue = PriorityQueue(client, Spider(name=ns), "%(spider)s:requests")
        for i in range(5):
            queue.push(Request(f"https://cli.example/{i}", priority=i))
        client.rpush(f"{ns}:start_urls", "https://cli.example/start")
        proc = seed_expand(tmp_path, "--from-scrapy-redis", ns, "--move", "--site-id", "cli",
                           "-s", f"METEORSEED_REDIS_URL={cluster.url}",
                           "-s", f"METEORSEED_NAMESPACE={ns}",
                           "-s", f"METEORSEED_STREAM_SHARDS={SHARDS}")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1].endswith(
            "enqueued 6, duplicates 0, rejected 0, removed 6 from scrapy-redis")
        # (in the task set of the spider whose queue they came from, named as the namespace)
        shard = KeyLayout(ns, SHARDS, cluster=True).with_spiders([ns]).for_site("cli")
        assert sum(client.xlen(stream) for stream in shard.set_streams(ns)) == 6
    finally:
        client.close()


def test_console_sites_page_reads_quota_sharing_sites_on_cluster(
    tmp_path: Path, cluster: LocalCluster, ns: str, api_server: ApiServer
) -> None:
    keys = KeyLayout(ns, SHARDS, cluster=True)
    sites = sites_covering(2)
    for site in sites:
        (tmp_path / f"{site}.json").write_text(json.dumps({
            "site_id": site, "version": 1, "allowed_domains": [f"{site}.example"],
            "list": {"links": "a::attr(href)"}, "fields": {"title": "h1::text"},
            "limits": {"quota_key": "one-host"}}))
    limits = SiteLimits(rate=50.0, burst=10, concurrency=10, quota_key="one-host")

    class Stats:
        def inc_value(self, key: str, n: int = 1) -> None:
            pass

    async def body(client: Any) -> None:
        await SiteGate(client, keys, lambda _s: limits, "c1", Backoff(1.0, 300.0)).pause(
            sites[0], 60.0)
        breaker = Breaker(client, keys, BreakerConfig(min_requests=4), Stats(),
                          lambda site: limits.quota(site))
        for i in range(8):
            breaker.record(sites[0], True, 0.1, False, task_id=f"t{i}")
        await breaker.flush()

    asyncio.run(_with_client(cluster.url, body))
    with api_server(redis_url=cluster.url, namespace=ns, shards=SHARDS,
                    sites_dir=str(tmp_path)) as server:
        status, _, body = Client(server.url).call("GET", "/sites")
    assert status == 200, body
    rows = {row["site_id"]: row for row in body["sites"]}
    assert rows[sites[0]]["breaker"] == "open" and rows[sites[1]]["breaker"] == "closed"
    assert rows[sites[0]]["paused_for_s"] > 0 and rows[sites[1]]["paused_for_s"] > 0  # shared


def test_sigkill_of_a_worker_on_cluster_loses_nothing(
    tmp_path: Path, cluster: LocalCluster, ns: str, demo_site: DemoSite
) -> None:
    keys = KeyLayout(ns, SHARDS, cluster=True)
    sites = sites_covering(SHARDS)
    tasks = [ExecTask.create(seed_id="s1", site_id=sites[i % SHARDS],
                             url=f"{demo_site.url}/slow/200?i={i}") for i in range(60)]
    enqueue(cluster.url, keys, tasks)
    settings: dict[str, Any] = {
        "METEORSEED_CLAIM_IDLE": 2, "CONCURRENT_REQUESTS": 8, "METEORSEED_IDLE_CLOSE": 3,
        "METEORSEED_STREAM_SHARDS": SHARDS, "METEORSEED_SITE_RATE": 100}
    client = sync_client(cluster.url, decode_responses=True)

    def held_by(name: str) -> int:  # pending on ``name``, over every shard's streams
        total = 0
        for stream in keys.streams:
            if client.exists(stream):
                summary = client.xpending(stream, keys.group)
                total += sum(int(c["pending"]) for c in summary["consumers"] or []
                             if c["name"] == name)
        return total

    try:
        victim = start_worker(tmp_path, cluster.url, ns, name="victim", **settings)
        other = start_worker(tmp_path, cluster.url, ns, name="other", **settings)
        wait_for(lambda: len(stored_docs(tmp_path / "items.db")) >= 10, 60)
        wait_for(lambda: held_by("victim") > 0, 30, 0.01)
        victim.kill()
        assert other.wait(180) == 0, other.log()[-3000:]
        docs = stored_docs(tmp_path / "items.db")
        assert {d["task_id"] for d in docs.values()} == {t.task_id for t in tasks}
        assert len(docs) == len(tasks)
        assert held_by("victim") == 0 and held_by("other") == 0
        assert sum(int(client.xlen(stream)) for stream in keys.streams) == 0
        assert other.stats().get("meteorseed/reclaimed", 0) > 0
    finally:
        client.close()


def test_seeder_runs_registered_seeds_into_their_shards_on_cluster(
    cluster: LocalCluster, ns: str
) -> None:
    keys = KeyLayout(ns, SHARDS, cluster=True)
    sites = sites_covering(SHARDS)

    async def body(client: Any) -> list[int]:
        seeder = Seeder(client, keys, config=SeederConfig(poll_s=0.2))
        for site in sites:
            await seeder.registry.put(SeedTask(
                seed_id=f"seed-{site}", site_id=site, task_type="url_list",
                payload={"urls": [f"https://{site}.example/{i}" for i in range(3)]},
                schedule="every 1h"))
        stop = asyncio.Event()
        running = asyncio.ensure_future(seeder.run(stop))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            records = [await seeder.registry.get(f"seed-{site}") for site in sites]
            if all(r is not None and r.runs == 1 for r in records):
                break
            await asyncio.sleep(0.1)
        stop.set()
        await running
        return [r.runs if r is not None else 0 for r in records]

    assert asyncio.run(_with_client(cluster.url, body)) == [1] * SHARDS
    client = sync_client(cluster.url, decode_responses=True)
    try:
        for site in sites:  # each seed expanded into its site's shard
            assert sum(client.xlen(s) for s in keys.for_site(site).streams) == 3, site
    finally:
        client.close()

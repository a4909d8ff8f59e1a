"""A cancel's sweep done in Redis, page by page (``lua/seed_cancel.lua``'s ``scan`` and
``dscan``), among many other seeds' tasks; and the control state in ``seeds list``, ``seeds
show`` and ``GET /seeds``. (The cancel's cost: benchmarks/seed_cancel.py.)"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.queue.consume import seed_control
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.crawl_progress import read_progress_sync
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client, sync_client
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.testing.cluster import LocalCluster
from tests.api_helpers import ApiServer, Client, url_list
from tests.console_browser import logged_in_console, needs_chromium, unexpected
from tests.test_seed_control import URLS, cli

#: Other seeds' tasks that look like the target's to a careless match (its id in their URL,
#: in a meta key ``seed_id``, as a prefix of their seed's id).
DECOYS = [
    ExecTask.create(seed_id="s10", site_id="site1", url="https://site1.test/s1"),
    ExecTask.create(seed_id="x", site_id="site2", url='https://site2.test/"s1"',
                    meta={"seed_id": "s1"}),
    ExecTask.create(seed_id="y", site_id="site3", url="https://site3.test/y",
                    cb_kwargs={"note": '"seed_id":"s1"'}),
]


def task(seed: str, n: int) -> ExecTask:
    site = f"site{n % 5}"
    return ExecTask.create(seed_id=seed, site_id=site, url=f"https://{site}.test/{seed}/{n}")


def stream_seeds(client: redis.Redis, keys: KeyLayout) -> list[str]:
    return sorted(json.loads(f["t"])["seed_id"] for sh in keys.shard_keys for s in sh.streams
                  for _i, f in client.xrange(s))


class Replies:
    """What a blocking client received: every reply, flattened to its strings."""

    def __init__(self, client: redis.Redis) -> None:
        self.texts: list[str] = []
        self.execute = client.execute_command

    def __call__(self, *args: Any, **options: Any) -> Any:
        reply = self.execute(*args, **options)
        self.texts.extend(self._flat(reply))
        return reply

    def _flat(self, value: Any) -> Iterator[str]:
        if isinstance(value, (list, tuple)):
            for each in value:
                yield from self._flat(each)
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from self._flat(k)
                yield from self._flat(v)
        elif isinstance(value, (str, bytes)):
            yield value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@pytest.mark.parametrize("shards", [1, 3])
def test_cancel_among_many_seeds_removes_exactly_its_unread_entries_reading_no_other_task(
        redis_url: str, namespace: str, sync_redis: redis.Redis, shards: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seed_control, "PAGE", 40)  # many pages, in every stream
    keys = KeyLayout(namespace, shards=shards)
    others = [task(f"other{n % 30}", n) for n in range(1500)]
    mine = [task("s1", n) for n in range(90)]
    mixed = [t for pair in zip(others[:90], mine, strict=True) for t in pair]
    rest = others[90:]

    async def start(client: Any) -> int:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        writer = TaskWriter(client, keys)
        await writer.add(mixed, dedup=False)  # (the first ones read below: in flight)
        got = await consumer.read(50, 0)
        await writer.add([*rest, *DECOYS], dedup=False)
        return sum(1 for d in got if d.task is not None and d.task.seed_id == "s1")

    read_of_mine = run(redis_url, start)
    assert 0 < read_of_mine < len(mine)
    before = read_progress_sync(sync_redis, keys, ["other7", "s10", "x", "y"])
    replies = Replies(sync_redis)
    monkeypatch.setattr(sync_redis, "execute_command", replies)
    removed = seed_control.cancel(sync_redis, keys, "s1", "ops")
    monkeypatch.undo()
    unread = len(mine) - read_of_mine
    assert removed == {"delayed": 0, "waiting": unread}
    left = stream_seeds(sync_redis, keys)
    assert left.count("s1") == read_of_mine  # (read ones stay: their worker settles them)
    assert len(left) == len(others) + len(DECOYS) + read_of_mine
    p1 = read_progress_sync(sync_redis, keys, ["s1"])["s1"]
    assert p1 is not None and (p1["cancelled"], p1["waiting"]) == (unread, read_of_mine)
    assert read_progress_sync(sync_redis, keys, ["other7", "s10", "x", "y"]) == before
    # Matched in Redis: no other seed's task came back to the client.
    assert not [t for t in replies.texts if re.search('"seed_id":"(other|s10|x|y)', t)]
    again = seed_control.cancel(sync_redis, keys, "s1", "ops")  # (nothing counted twice)
    assert again == {"delayed": 0, "waiting": 0}
    p1 = read_progress_sync(sync_redis, keys, ["s1"])["s1"]
    assert p1 is not None and p1["cancelled"] == unread


@pytest.mark.parametrize("shards", [1, 3])
def test_cancel_pages_through_a_large_delayed_set(
        redis_url: str, namespace: str, sync_redis: redis.Redis, shards: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seed_control, "PAGE", 20)
    keys = KeyLayout(namespace, shards=shards)
    tasks = [task("s1" if n % 10 == 0 else f"other{n % 7}", n) for n in range(400)]

    async def park(client: Any) -> None:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([*tasks, *DECOYS], dedup=False)
        delayed = DelayedSet(client, keys)
        while got := await consumer.read(100, 0):
            for d in got:
                assert d.task is not None
                assert await delayed.defer(d.ref, d.task, 600, "", DeferReason.QUOTA)

    run(redis_url, park)
    replies = Replies(sync_redis)
    monkeypatch.setattr(sync_redis, "execute_command", replies)
    removed = seed_control.cancel(sync_redis, keys, "s1", "ops")
    monkeypatch.undo()
    assert removed == {"delayed": 40, "waiting": 0}
    members = [m for sh in keys.shard_keys for d in sh.delayeds
               for m in sync_redis.zrange(d, 0, -1)]
    assert len(members) == 360 + len(DECOYS)
    assert not [m for m in members if json.loads(m.split("|", 1)[1])["seed_id"] == "s1"]
    p1 = read_progress_sync(sync_redis, keys, ["s1"])["s1"]
    assert p1 is not None and (p1["cancelled"], p1["delayed"], p1["state"]) == (
        40, 0, "finished")
    assert not [t for t in replies.texts if '"seed_id":"other' in t]


SEED_IDS = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)).filter(lambda c: not c.isspace()),
            min_size=1, max_size=40),
    st.sampled_from(['s"1', "s\\1", 's1"', "é", "\U0001f600", "\x01", "s\\u0031", "{", "|",
                     '"seed_id":"s"', "s" * 200]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(seed=SEED_IDS)
def test_cancel_finds_a_seed_whatever_its_id_and_only_it(
        redis_url: str, sync_redis: redis.Redis, seed: str) -> None:
    keys = KeyLayout(f"t{uuid.uuid4().hex[:12]}")
    mine = [ExecTask.create(seed_id=seed, site_id="a", url=f"https://a.test/{n}")
            for n in range(3)]
    near = [ExecTask.create(seed_id=seed[:199] + "0", site_id="a", url="https://a.test/near"),
            ExecTask.create(seed_id="z", site_id="a", url="https://a.test/far",
                            meta={"seed_id": seed, "s": seed})]
    escaped = {"v": "1", "t": json.dumps({**mine[0].to_dict(), "task_id": "esc",
                                          "url": "https://a.test/esc"})}  # (ASCII-escaped)
    broken = '{"seed_id":' + json.dumps(seed, ensure_ascii=False) + ","  # (not a task)

    async def fill(client: Any) -> None:
        await StreamConsumer(client, keys, "w1").ensure_group()
        await TaskWriter(client, keys).add([*mine, *near], dedup=False)

    try:
        run(redis_url, fill)
        sync_redis.xadd(keys.stream, escaped)
        sync_redis.xadd(keys.stream, {"v": "1", "t": broken})
        assert seed_control.cancel(sync_redis, keys, seed, "ops") == {
            "delayed": 0, "waiting": 4}
        left = [f["t"] for _i, f in sync_redis.xrange(keys.stream)]
        assert len(left) == 3 and left[2] == broken
        assert sorted(json.loads(t)["url"] for t in left[:2]) == [
            "https://a.test/far", "https://a.test/near"]
    finally:
        found = list(sync_redis.scan_iter(f"{keys.namespace}:*"))
        if found:
            sync_redis.delete(*found)


def test_the_list_show_and_api_state_says_paused_or_cancelled(
        redis_url: str, namespace: str, sync_redis: redis.Redis, api_server: ApiServer) -> None:
    keys = KeyLayout(namespace)

    async def register(client: Any) -> None:
        registry = SeedRegistry(client, keys)
        for seed in ("p1", "c1", "f1"):
            await registry.put(SeedTask(seed_id=seed, site_id="news", task_type="url_list",
                                        payload={"urls": ["https://news.example/"]}))
        await StreamConsumer(client, keys, "w1").ensure_group()
        await TaskWriter(client, keys).add([task(s, n) for s in ("p1", "c1", "f1")
                                            for n in range(2)])

    run(redis_url, register)
    assert seed_control.hold(sync_redis, keys, "p1", "ops")
    seed_control.cancel(sync_redis, keys, "c1", "ops")
    code, out, err = cli(redis_url, namespace, "seeds", "list")
    assert code == 0, err
    states = {line.split()[0]: line.split()[2] for line in out.splitlines()[1:] if line}
    assert states == {"p1": "paused", "c1": "cancelled", "f1": "running"}, out
    code, out, _ = cli(redis_url, namespace, "seeds", "list", "--json")
    listed = {s["seed_id"]: s for s in json.loads(out)}
    assert listed["p1"]["control"]["held"] and listed["c1"]["control"]["cancelled"]
    assert listed["f1"]["control"] is None
    for seed, state in (("p1", "paused"), ("c1", "cancelled"), ("f1", "running")):
        code, out, _ = cli(redis_url, namespace, "seeds", "show", seed)
        assert f"state:      {state}\n" in out, out
    with api_server() as srv:
        status, _, body = Client(srv.url).call("GET", "/seeds")
    assert status == 200
    controls = {s["seed"]["seed_id"]: s["control"] for s in body["seeds"]}
    assert controls["p1"]["held"] and not controls["p1"]["cancelled"]
    assert controls["c1"]["cancelled"] and controls["f1"] is None
    assert seed_control.release(sync_redis, keys, "p1", "ops") == 0
    code, out, _ = cli(redis_url, namespace, "seeds", "show", "p1")
    assert "state:      running\n" in out, out


def test_cancel_pages_on_a_cluster(cluster: LocalCluster, ns: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seed_control, "PAGE", 16)
    keys = KeyLayout(ns, shards=3, cluster=True)
    tasks = [task("s1" if n % 10 == 0 else f"other{n % 7}", n) for n in range(300)]
    client = sync_client(cluster.url, decode_responses=True)

    async def start() -> tuple[int, int]:
        aclient = async_client(cluster.url, decode_responses=True)
        try:
            consumer = StreamConsumer(aclient, keys, "w1")
            await consumer.ensure_group()
            await TaskWriter(aclient, keys).add(tasks, dedup=False)
            got = [d for d in await consumer.read(60, 0) if d.task is not None]
            delayed = DelayedSet(aclient, keys)
            for d in got:
                assert d.task is not None
                assert await delayed.defer(d.ref, d.task, 600, "", DeferReason.QUOTA)
            return len(got), sum(1 for d in got if d.task and d.task.seed_id == "s1")
        finally:
            await aclient.aclose()

    try:
        parked, parked_mine = asyncio.run(start())
        assert parked == 60 and 0 < parked_mine < 30
        removed = seed_control.cancel(client, keys, "s1", "ops")
        assert removed == {"delayed": parked_mine, "waiting": 30 - parked_mine}
        assert stream_seeds(client, keys).count("s1") == 0
        assert len(stream_seeds(client, keys)) == 300 - 30 - (parked - parked_mine)
        p1 = read_progress_sync(client, keys, ["s1"])["s1"]
        assert p1 is not None and (p1["state"], p1["cancelled"]) == ("finished", 30)
    finally:
        client.close()


@needs_chromium
def test_the_console_seed_tables_say_paused(api_server: ApiServer) -> None:
    async def flow(base: str) -> list[str]:
        from playwright.async_api import expect

        errors: list[str] = []
        async with logged_in_console(base, errors) as page:
            await expect(page.locator("[data-testid=status-p1]")).to_have_text("paused")
            await expect(page.locator("[data-testid=progress-p1]")).to_have_text("paused")
            await expect(page.locator("[data-testid=progress-q1]")).to_have_text("running")
        return errors

    with api_server() as srv:
        client = Client(srv.url)
        for seed in ("p1", "q1"):  # (URLs of their own: not deduplicated)
            status, _, body = client.call("POST", "/dispatch", url_list(
                seed, [f"{u}/{seed}" for u in URLS]))
            assert status == 202, body
        assert client.call("POST", "/seeds/p1/pause")[0] == 200
        assert unexpected(asyncio.run(flow(srv.url))) == []

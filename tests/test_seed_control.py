"""An operator's hand on a seed (issue 24.4): hold, resume and cancel against a real Redis, on
one Redis and on a sharded layout, and through ``meteorseed seeds``. (The four-worker figure:
tests/test_seed_control_fleet.py.)"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.queue.consume import seed_control
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.crawl_progress import (
    Settle,
    events_key,
    finish_if_done,
    read_progress_sync,
)
from meteorseed_scrapy.queue.fleet.delayed import reason_of
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.connection import async_client, sync_client
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.testing.cluster import LocalCluster
from tests.api_helpers import ApiServer, Client, url_list
from tests.cli_helpers import cli
from tests.console_browser import logged_in_console, needs_chromium, unexpected

URLS = ["https://news.example/1", "https://news.example/2"]


def task(seed: str, n: int) -> ExecTask:
    site = f"site{n % 5}"
    return ExecTask.create(seed_id=seed, site_id=site, url=f"https://{site}.test/{seed}/{n}")


def told(sync_redis: redis.Redis, keys: KeyLayout) -> list[tuple[str, str]]:
    return [(f["event"], f.get("seed", "")) for _i, f in sync_redis.xrange(keys.events)]


def test_resume_wakes_the_seeds_parked_tasks_only(redis_url: str, namespace: str,
                                                  sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    mine, other = [task("s1", i) for i in range(3)], task("s2", 9)
    assert seed_control.hold(sync_redis, keys, "s1", "ops@host", "too fast")
    assert not seed_control.hold(sync_redis, keys, "s1", "someone@else")  # the first stays

    async def park(client: Any) -> None:
        await TaskWriter(client, keys).add([*mine, other])
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        delayed = DelayedSet(client, keys)
        for d in await consumer.read(10, 0):
            assert d.task is not None
            assert await delayed.defer(d.ref, d.task, seed_control.PARK_S, "",
                                       DeferReason.PAUSED)

    run(redis_url, park)
    assert seed_control.release(sync_redis, keys, "s1", "ops@host") == 3
    assert seed_control.release(sync_redis, keys, "s1", "ops@host") is None
    now_ms = sync_redis.time()[0] * 1000
    due = {json.loads(m.split("|", 1)[1])["seed_id"] + json.loads(m.split("|", 1)[1])["url"]:
           s for m, s in sync_redis.zrange(keys.delayed, 0, -1, withscores=True)}
    assert sum(1 for k, s in due.items() if k.startswith("s1") and s <= now_ms + 1000) == 3
    assert all(reason_of(s) == "paused" for s in due.values())
    assert next(s for k, s in due.items() if k.startswith("s2")) > now_ms + 3000_000
    events = [f for _i, f in sync_redis.xrange(keys.events) if f["event"].startswith("seed ")]
    assert [(e["event"], e["seed"], e["by"]) for e in events] == [
        ("seed paused", "s1", "ops@host"), ("seed resumed", "s1", "ops@host")]
    assert events[0]["reason"] == "too fast" and events[1]["woken"] == "3"


@pytest.mark.parametrize("shards", [1, 3])
def test_cancel_removes_and_counts_waiting_and_delayed_tasks_in_flight_ones_finish(
        redis_url: str, namespace: str, sync_redis: redis.Redis, shards: int) -> None:
    keys = KeyLayout(namespace, shards=shards)
    mine, others = [task("s1", i) for i in range(20)], [task("s2", i) for i in range(5)]

    async def start(client: Any) -> list[Any]:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add(mine)
        got = await consumer.read(6, 0)  # six of s1 read: two in flight, four parked
        delayed = DelayedSet(client, keys)
        for d in got[2:]:
            assert d.task is not None
            assert await delayed.defer(d.ref, d.task, 60, "", DeferReason.QUOTA)
        await TaskWriter(client, keys).add(others)
        return got[:2]

    in_flight = run(redis_url, start)
    removed = seed_control.cancel(sync_redis, keys, "s1", "ops@host")
    assert removed == {"delayed": 4, "waiting": 14}
    progress = read_progress_sync(sync_redis, keys, ["s1", "s2"])
    p1 = progress["s1"]
    assert p1 is not None and p1["state"] == "running"
    assert (p1["cancelled"], p1["delayed"], p1["waiting"], p1["outstanding"]) == (18, 0, 2, 2)
    assert progress["s2"] is not None and progress["s2"]["waiting"] == 5  # untouched
    assert sum(sync_redis.xlen(s) for sh in keys.shard_keys for s in sh.streams) == 2 + 5
    assert not any(sync_redis.zcard(d) for sh in keys.shard_keys for d in sh.delayeds)

    async def finish(client: Any) -> int:  # the two in flight finish normally
        consumer = StreamConsumer(client, keys, "w1")
        return await consumer.complete([d.ref for d in in_flight], 60, [
            Settle("s1", d.task.site_id, 1) for d in in_flight])

    assert run(redis_url, finish) == 2
    p1 = read_progress_sync(sync_redis, keys, ["s1"])["s1"]
    assert p1 is not None and (p1["state"], p1["done"], p1["cancelled"]) == ("finished", 2, 18)
    assert [e for e in told(sync_redis, keys) if e[1] == "s1"] == [
        ("started", "s1"), ("seed cancelled", "s1"), ("finished", "s1")]
    _code, out, _ = cli(redis_url, namespace, "task", mine[-1].url, "--site", mine[-1].site_id)
    assert "cancelled" in out, out


@pytest.mark.parametrize("shards", [1, 3])
def test_a_task_read_after_the_cancel_is_settled_cancelled_once(
        redis_url: str, namespace: str, sync_redis: redis.Redis, shards: int) -> None:
    keys = KeyLayout(namespace, shards=shards)

    async def body(client: Any) -> tuple[int, int]:
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        await TaskWriter(client, keys).add([task("s1", i) for i in range(3)])
        got = await consumer.read(3, 0)
        seed_control.cancel(sync_redis, keys, "s1", "ops")  # read already: not removed
        script = scripts.register(client, "seed_cancel")
        counts = []
        for _ in range(2):  # (acked the first time: not counted twice)
            settled, zeroed = 0, set()
            for d in got:
                n, seeds = await script(keys=[d.ref[0]], args=[
                    "pending", keys.group, "w1", events_key(keys), "1.0", 60, d.ref[1], "s1",
                    d.task.site_id])
                settled, zeroed = settled + int(n), zeroed | set(seeds)
            if zeroed and keys.tagged:  # (as the worker does: worker/seed_holds.py)
                await finish_if_done(client, keys, sorted(zeroed), 60)
            counts.append(settled)
        return counts[0], counts[1]

    assert run(redis_url, body) == (3, 0)
    p1 = read_progress_sync(sync_redis, keys, ["s1"])["s1"]
    assert p1 is not None and (p1["state"], p1["cancelled"]) == ("finished", 3)
    assert [e for e, s in told(sync_redis, keys)].count("finished") == 1


def test_the_cli_pauses_resumes_cancels_and_lists(redis_url: str, namespace: str,
                                                  sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    code, out, err = cli(redis_url, namespace, "seeds", "pause", "s1", "--by", "ann",
                         "--reason", "asked")
    assert code == 0 and "seed s1 held fleet-wide" in out, err
    assert sync_redis.hexists(keys.seeds_held, "s1")
    code, out, _ = cli(redis_url, namespace, "seeds", "controls", "--json")
    listed = json.loads(out)
    assert listed["s1"]["held"] and listed["s1"]["by"] == "ann"
    assert listed["s1"]["reason"] == "asked"
    code, out, _ = cli(redis_url, namespace, "seeds", "resume", "s1")
    assert code == 0 and "seed s1 resumed: 0 parked" in out
    code, out, _ = cli(redis_url, namespace, "seeds", "resume", "s1")
    assert code != 0 and "was not held" in out
    code, out, _ = cli(redis_url, namespace, "seeds", "cancel", "s1", "--json")
    assert code == 0 and json.loads(out)["removed"] == {"delayed": 0, "waiting": 0}
    code, out, _ = cli(redis_url, namespace, "seeds", "show", "s1", "--json")
    assert json.loads(out)["control"]["cancelled"] is True
    assert "@" in json.loads(out)["control"]["by"]  # (user@host when --by is not given)
    code, out, _ = cli(redis_url, namespace, "seeds", "resume", "s1")  # lifts the mark
    assert code == 0 and not sync_redis.zscore(keys.seeds_cancelled, "s1")
    code, _, err = cli(redis_url, namespace, "seeds", "pause", "bad seed")
    assert code != 0 and "seed_id" in err
    assert [(e, s) for e, s in told(sync_redis, keys)] == [
        ("seed paused", "s1"), ("seed resumed", "s1"), ("seed cancelled", "s1"),
        ("seed resumed", "s1")]


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.text(max_size=300), st.sampled_from(
    ["", " ", "a b", "a\nb", "x" * 201, "a\tb", "\x00", "s\u200b1"])))
def test_a_malformed_seed_id_is_refused_naming_the_field(seed: str) -> None:
    try:
        ok = seed_control.checked(seed)
    except ValueError as exc:
        assert "seed_id" in str(exc)
    else:
        assert ok == seed and seed.strip() == seed and seed


@needs_chromium
def test_the_console_pauses_resumes_and_cancels_a_seed(api_server: ApiServer, namespace: str,
                                                      sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    async def flow(base: str) -> list[str]:
        from playwright.async_api import expect

        errors: list[str] = []
        async with logged_in_console(base, errors) as page:
            page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
            cell = page.locator("[data-testid=seed-control-p1]")
            await cell.locator("button", has_text="Pause").click()
            await expect(page.locator("#flash")).to_contain_text("Seed p1 held fleet-wide")
            await expect(cell).to_have_attribute("title", re.compile("^paused by api@"))
            assert sync_redis.hexists(keys.seeds_held, "p1")
            await cell.locator("button", has_text="Resume").click()
            await expect(page.locator("#flash")).to_contain_text("Seed p1 resumed")
            await cell.locator("button", has_text="Cancel").click()
            await expect(page.locator("#flash")).to_contain_text(
                "Seed p1 cancelled: 2 waiting and 0 delayed task(s) removed")
            await expect(cell).to_contain_text("cancelled")
            await expect(cell).to_have_attribute("title", re.compile("^cancelled by api@"))
            await expect(page.locator("[data-testid=cancelled-p1]")).to_have_text("2")
            await expect(page.locator("[data-testid=progress-p1]")).to_have_text("cancelled")
            await page.set_viewport_size({"width": 800, "height": 900})
            assert await page.locator("#overview-progress").evaluate(  # (it fits at 800 px)
                "box => box.scrollWidth <= box.clientWidth")
        return errors

    with api_server() as srv:
        dispatched = Client(srv.url).call("POST", "/dispatch", url_list("p1", URLS))
        assert dispatched[0] == 202, dispatched
        assert unexpected(asyncio.run(flow(srv.url))) == []
    assert [e for e, s in told(sync_redis, keys) if e.startswith("seed ")] == [
        "seed paused", "seed resumed", "seed cancelled"]


def test_the_api_pauses_resumes_and_cancels_naming_bad_fields(
        api_server: ApiServer, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    with api_server() as srv:
        client = Client(srv.url)
        status, _, body = client.call("POST", "/dispatch", url_list("p1", URLS))
        assert status == 202, body
        status, _, body = client.call("POST", "/seeds/p1/pause", {"reason": "asked"})
        assert status == 200 and body == {"seed_id": "p1", "held": True, "already": False}
        status, _, body = client.call("GET", "/seeds/p1")
        assert body["control"]["held"] and body["control"]["reason"] == "asked"
        status, _, body = client.call("POST", "/seeds/p1/pause", {"reason": 5, "color": 1})
        assert status == 422 and {e["field"] for e in body["errors"]} == {"reason", "color"}
        status, _, body = client.call("POST", "/seeds/p1/resume")
        assert status == 200 and body["was_held"] is True
        status, _, body = client.call("GET", "/seed-controls")
        assert body["p1"]["state"] == "resumed" and body["p1"]["by"].startswith("api@")
        status, _, body = client.call("POST", "/seeds/p1/cancel")
        assert status == 200 and body["removed"] == {"waiting": 2, "delayed": 0}
        status, _, body = client.call("GET", "/seeds/p1")
        assert body["progress"]["cancelled"] == 2 and body["progress"]["state"] == "finished"
        assert body["control"]["cancelled"] is True
        for bad in ("bad%20seed", "x" * 300):
            status, _, body = client.call("POST", f"/seeds/{bad}/cancel")
            assert status == 422 and body["errors"][0]["field"] == "path.seed_id", body
        status, _, body = client.call("POST", "/seeds/p1/pause", token=None)
        assert status == 401
    assert not sync_redis.exists(keys.seeds_held)


def test_cancel_and_resume_on_a_cluster(cluster: LocalCluster, ns: str) -> None:
    keys = KeyLayout(ns, shards=3, cluster=True)
    client = sync_client(cluster.url, decode_responses=True)
    try:
        async def start(aclient: Any) -> None:
            await StreamConsumer(aclient, keys, "w1").ensure_group()
            await TaskWriter(aclient, keys).add([task("s1", i) for i in range(9)])

        async def main() -> None:
            aclient = async_client(cluster.url, decode_responses=True)
            try:
                await start(aclient)
            finally:
                await aclient.aclose()

        asyncio.run(main())
        assert seed_control.hold(client, keys, "s1", "ops")
        assert seed_control.cancel(client, keys, "s1", "ops") == {"delayed": 0, "waiting": 9}
        progress = read_progress_sync(client, keys, ["s1"])["s1"]
        assert progress is not None and (progress["state"], progress["cancelled"]) == (
            "finished", 9)
        assert seed_control.release(client, keys, "s1", "ops") == 0  # the mark lifted
        assert seed_control.controls(client, keys)["s1"]["cancelled"] is False
        assert [f["event"] for _i, f in client.xrange(keys.events)] == [
            "started", "seed paused", "finished", "seed cancelled", "seed resumed"]
    finally:
        client.close()

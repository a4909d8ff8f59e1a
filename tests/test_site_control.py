"""An operator's hand on a site (issue 24.4): hold, resume, limit — in gate.lua against a real
Redis, through ``meteorseed sites``, and on a fleet of four workers (the time from the command to
the last request that reaches the site is printed; nothing is lost)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.politeness import control
from meteorseed_scrapy.politeness.control import HOLD_RECHECK_S, SiteRef
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.delayed import reason_of
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.testing.demo_pages import Reply
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.api_helpers import ApiServer, Client
from tests.cli_helpers import cli
from tests.console_browser import logged_in_console, needs_chromium, unexpected
from tests.e2e_helpers import enqueue, start_worker, stored_docs

LIMITS = SiteLimits(rate=1000.0, burst=1000, concurrency=100)


def make_gate(client: Any, ns: str) -> SiteGate:
    return SiteGate(client, KeyLayout(ns), lambda _site: LIMITS, "c1", Backoff(1.0, 300.0))


def test_a_held_site_gets_no_permit_until_resumed(redis_url: str, namespace: str,
                                                  sync_redis: redis.Redis) -> None:
    keys, ref = KeyLayout(namespace), SiteRef("news")
    assert control.hold(sync_redis, keys, ref, "ops@host", "site asked us to stop")
    assert not control.hold(sync_redis, keys, ref, "someone@else")  # the first hold stays

    async def ask(client: Any) -> tuple[int, float, bool, int, bool]:
        gate = make_gate(client, namespace)
        held, other = await gate.acquire("news", 5), await gate.acquire("shop", 5)
        return len(held.lease_ids), held.wait_s, held.held, len(other.lease_ids), other.held

    # (the grant says it is a hold: the worker parks for it on a fresh view only)
    assert run(redis_url, ask) == (0, HOLD_RECHECK_S, True, 5, False)  # another site not held
    assert control.release(sync_redis, keys, ref, "ops@host") == 0
    assert control.release(sync_redis, keys, ref, "ops@host") is None  # not held any more
    assert len(run(redis_url, lambda c: make_gate(c, namespace).acquire("news", 5)).lease_ids) == 5
    events = [fields for _id, fields in sync_redis.xrange(keys.events)]
    assert [(e["event"], e["site"], e["by"]) for e in events] == [
        ("site paused", "news", "ops@host"), ("site resumed", "news", "ops@host")]
    assert events[0]["reason"] == "site asked us to stop"


def test_an_override_replaces_the_sites_rate_and_concurrency_until_reset(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys, ref = KeyLayout(namespace), SiteRef("news")
    control.limit(sync_redis, keys, ref, "ops@host", rate=0.5, concurrency=2)

    async def ask(client: Any) -> tuple[int, int]:
        gate = make_gate(client, namespace)
        first = await gate.acquire("news", 10)  # burst at most the rate: 1
        return len(first.lease_ids), len((await gate.acquire("news", 10)).lease_ids)

    assert run(redis_url, ask) == (1, 0)
    control.limit(sync_redis, keys, ref, "ops@host", rate=1000.0, concurrency=2)
    sync_redis.delete(keys.site("news", "leases"), keys.site("news", "bucket"))
    assert len(run(redis_url, lambda c: make_gate(c, namespace).acquire("news", 10))
               .lease_ids) == 2  # the concurrency override
    assert control.unlimit(sync_redis, keys, ref, "ops@host")
    assert not control.unlimit(sync_redis, keys, ref, "ops@host")
    sync_redis.delete(keys.site("news", "leases"), keys.site("news", "bucket"))
    assert len(run(redis_url, lambda c: make_gate(c, namespace).acquire("news", 10))
               .lease_ids) == 10


@pytest.mark.parametrize(("rate", "concurrency"), [
    (0.0, None), (-1.0, None), (float("nan"), None), (float("inf"), None), (None, 0),
    (None, None)])
def test_an_invalid_override_is_refused_before_any_write(
        sync_redis: redis.Redis, namespace: str, rate: float | None,
        concurrency: int | None) -> None:
    keys = KeyLayout(namespace)
    with pytest.raises(ValueError):
        control.limit(sync_redis, keys, SiteRef("news"), "x", rate=rate, concurrency=concurrency)
    assert not sync_redis.exists(keys.site("news", "override"), keys.overrides, keys.events)


@pytest.mark.parametrize("site", ["", "news site", "news\n", "x" * 1000])
def test_a_malformed_site_is_refused_naming_the_field(site: str) -> None:
    with pytest.raises(ValueError, match="site_id"):
        SiteRef(site)


def test_resume_wakes_the_sites_parked_tasks_only(redis_url: str, namespace: str,
                                                  sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    news = [ExecTask.create(seed_id="s", site_id="news", url=f"https://news.test/{i}")
            for i in range(3)]
    shop = ExecTask.create(seed_id="s", site_id="shop", url="https://shop.test/1")
    quota = ExecTask.create(seed_id="s", site_id="news", url="https://news.test/quota")
    control.hold(sync_redis, keys, SiteRef("news"), "ops")

    async def park(client: Any) -> None:
        await TaskWriter(client, keys).add([*news, shop, quota])
        consumer = StreamConsumer(client, keys, "w1")
        await consumer.ensure_group()
        delayed = DelayedSet(client, KeyLayout(namespace))
        for d in await consumer.read(10, 0):
            assert d.task is not None
            why = DeferReason.QUOTA if d.task.url == quota.url else DeferReason.PAUSED
            assert await delayed.defer(d.ref, d.task, HOLD_RECHECK_S, "", why)

    run(redis_url, park)
    assert control.release(sync_redis, keys, SiteRef("news"), "ops") == 3
    now_ms = time.time() * 1000
    due = {json.loads(m.split("|", 1)[1])["url"]: (s, reason_of(s))
           for m, s in sync_redis.zrange(keys.delayed, 0, -1, withscores=True)}
    for task in news:
        score, why = due[task.url]
        assert score <= now_ms + 1000 and why == "paused"  # due now, its reason kept
    assert due[shop.url][0] > now_ms + 3000_000 and due[quota.url][0] > now_ms + 3000_000


def test_the_cli_pauses_resumes_limits_and_lists(redis_url: str, namespace: str,
                                                 sync_redis: redis.Redis) -> None:
    code, out, err = cli(redis_url, namespace, "sites", "pause", "news", "--reason", "asked")
    assert code == 0 and "news held fleet-wide" in out, err
    code, out, _ = cli(redis_url, namespace, "sites", "limit", "shop", "--rate", "0.2")
    assert code == 0 and "rate 0.2" in out
    code, out, _ = cli(redis_url, namespace, "sites", "controls", "--json")
    listed = json.loads(out)
    assert listed["news"]["held"]["reason"] == "asked" and "@" in listed["news"]["held"]["by"]
    assert listed["shop"]["override"]["rate"] == 0.2
    code, _, err = cli(redis_url, namespace, "sites", "limit", "shop", "--rate", "fast")
    assert code != 0 and "--rate" in err
    code, _, err = cli(redis_url, namespace, "sites", "limit", "shop", "--concurrency", "0")
    assert code != 0 and "--concurrency" in err
    code, _, err = cli(redis_url, namespace, "sites", "pause", "bad site")
    assert code != 0 and "site_id" in err
    code, out, _ = cli(redis_url, namespace, "sites", "resume", "news")
    assert code == 0 and "news resumed" in out
    code, out, _ = cli(redis_url, namespace, "sites", "resume", "news")
    assert code != 0 and "was not held" in out
    code, out, _ = cli(redis_url, namespace, "sites", "limit", "shop", "--reset")
    assert code == 0 and "back to its own limits" in out
    assert cli(redis_url, namespace, "sites", "controls")[1].startswith("no site is held")


class TimedSite(DemoSite):
    """The demo site, noting when each request arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[float] = []
        self._arrivals_lock = threading.Lock()

    def handle(self, target: str) -> Reply:
        with self._arrivals_lock:
            self.arrivals.append(time.monotonic())
        return super().handle(target)


@pytest.mark.e2e
def test_a_paused_site_is_left_alone_by_four_workers_then_finished(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    with TimedSite() as site:
        tasks = enqueue(redis_url, namespace, [f"{site.url}/slow/300?i={i}" for i in range(200)])
        store = tmp_path / "items.db"
        workers = [start_worker(tmp_path, redis_url, namespace, name=f"w{i}", store=store,
                                CONCURRENT_REQUESTS=8, METEORSEED_IDLE_CLOSE=0)
                   for i in range(4)]
        try:
            wait_for(lambda: len(stored_docs(store)) >= 20, 120)
            paused_at = time.monotonic()
            code, _, err = cli(redis_url, namespace, "sites", "pause", "probe")
            assert code == 0, err
            held_at = time.monotonic()  # (the hold is in Redis once the command has returned)
            # Every task of the site is parked or done: nothing waits, nothing is pending.
            wait_for(lambda: sync_redis.xlen(keys.stream) == 0
                     and sync_redis.zcard(keys.delayed) + len(stored_docs(store))
                     == len(tasks), 120)
            stored_while_held = len(stored_docs(store))
            with site._arrivals_lock:
                after = [t - paused_at for t in site.arrivals if t > paused_at]
                after_hold = [t - held_at for t in site.arrivals if t > held_at]
            code, _, err = cli(redis_url, namespace, "sites", "resume", "probe")
            assert code == 0, err
            wait_for(lambda: len(stored_docs(store)) == len(tasks), 180)
        finally:
            for w in workers:
                w.signal(signal.SIGTERM)
            for w in workers:
                w.wait(60)
    # What reached the site once the hold was set: requests already permitted then (4 workers
    # x 8 at most), none later. (Counted from the command's start, a loaded machine adds the
    # requests sent while the CLI process was still starting.)
    assert len(after_hold) <= 4 * 8, after_hold
    assert stored_while_held < len(tasks)
    docs = stored_docs(store)
    assert {d["task_id"] for d in docs.values()} == {t.task_id for t in tasks}
    print(f"pause -> last request at the site: {max(after, default=0.0):.2f} s "
          f"({len(after)} request(s) after the command, 4 workers x 8)")


def test_the_api_pauses_resumes_and_limits_naming_bad_fields(
        api_server: ApiServer, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    with api_server() as server:
        client = Client(server.url)
        status, _, body = client.call("POST", "/sites/news/pause", {"reason": 5, "color": 1})
        assert status == 422
        assert {e["field"] for e in body["errors"]} == {"reason", "color"}
        assert {"field": "color", "problem": "is not a field of a pause (expected reason)"
                } in body["errors"]
        assert not sync_redis.exists(keys.site("news", "hold"))
        status, _, body = client.call("POST", "/sites/news/pause", {"reason": "asked"})
        assert status == 200 and body == {"site_id": "news", "held": True, "already": False}
        assert sync_redis.exists(keys.site("news", "hold"))
        status, _, body = client.call("POST", "/sites/news/limit", {"rate": "fast"})
        assert status == 422 and body["errors"][0]["field"] == "rate"
        status, _, body = client.call("POST", "/sites/news/limit",
                                      {"rate": 2, "concurrency": 0, "color": "red"})
        assert status == 422
        assert {e["field"] for e in body["errors"]} == {"concurrency", "color"}
        assert {"field": "color", "problem": "is not a field of a limit (expected concurrency, "
                                             "rate, reset)"} in body["errors"]
        status, _, body = client.call("POST", "/sites/news/limit", {"rate": 2})
        assert status == 200 and body["rate"] == 2
        status, _, body = client.call("GET", "/controls")
        assert body["news"]["held"]["by"].startswith("api@")
        assert body["news"]["override"]["rate"] == 2
        status, _, body = client.call("POST", "/sites/news/resume")
        assert status == 200 and body["was_held"] is True
        status, _, body = client.call("POST", "/sites/news/limit", {"reset": True})
        assert status == 200 and body["reset"] is True
        status, _, body = client.call("POST", "/sites/bad%20site/pause")
        assert status == 422 and body["errors"][0]["field"] == "path.site_id"
        for raw, field, problem in (
                (b'{"rate": ', "body", "is not valid JSON"), (b"\xff", "body", "UTF-8"),
                (b"[1]", "body", "is not a JSON object"),
                (b"[" * 100_000, "body" + "[0]" * 64, "nests deeper than 64 levels")):
            status, _, body = client.call("POST", "/sites/news/limit", raw=raw)
            assert status == 422 and body["errors"][0]["field"] == field, (raw[:20], body)
            assert problem in body["errors"][0]["problem"]
        assert not sync_redis.exists(keys.site("news", "override"))  # nothing written


@needs_chromium
def test_the_console_pauses_and_resumes_a_site(api_server: ApiServer, namespace: str,
                                               sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.site("news", "bucket"), mapping={"tokens": 1, "ts": 0})  # a known site

    async def flow(base: str) -> list[str]:
        from playwright.async_api import expect

        errors: list[str] = []
        async with logged_in_console(base, errors) as page:
            await page.click("nav a[data-page=sites]")
            cell = page.locator("[data-testid=hold-news]")
            await cell.locator("button", has_text="Pause").click()
            await expect(page.locator("#flash")).to_contain_text("news held fleet-wide")
            await expect(cell).to_contain_text("held by api@")
            assert sync_redis.exists(keys.site("news", "hold"))
            await cell.locator("button", has_text="Resume").click()
            await expect(page.locator("#flash")).to_contain_text("news resumed")
            await expect(cell.locator("button")).to_have_text("Pause")
        return errors

    with api_server() as srv:
        errors = asyncio.run(flow(srv.url))
    assert unexpected(errors) == []
    assert not sync_redis.exists(keys.site("news", "hold"))
    assert [f["event"] for _i, f in sync_redis.xrange(keys.events)] == ["site paused",
                                                                      "site resumed"]

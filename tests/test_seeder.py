"""The long-running seeder on a real Redis and a loopback sitemap site: re-fetching a seed's
own pages, adaptive intervals from real runs, failures, edits taking effect at once, two
seeders at once, Redis outages, graceful stop, and ``scrapy seed-expand --watch`` /
``meteorseed seeder`` as real processes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding import runner
from meteorseed_scrapy.seeding.adapt import Bounds
from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.seeding.records import SeedRecord
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.seeder import RunResult, Seeder, SeederConfig
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.testing.loopback import LoopbackHandler, LoopbackSite
from meteorseed_scrapy.testing.polling import wait_for, wait_until
from meteorseed_scrapy.testing.redis_server import RedisServer
from tests.e2e_helpers import running, terminate

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
T = TypeVar("T")


class SitemapSite(LoopbackSite):
    """Serves ``pages`` (path -> XML), which a test may change between runs; else 404."""

    def __init__(self) -> None:
        super().__init__()
        self.pages: dict[str, bytes] = {}
        self.delay = 0.0  # seconds before each answer (a slow site)

    class handler(LoopbackHandler):  # (the attribute name LoopbackSite expects)
        site: SitemapSite

        def serve(self, head: bool = False) -> None:
            time.sleep(self.site.delay)
            body = self.site.pages.get(self.path)
            if body is None:
                self.send_page(404, "text/plain", b"gone", {}, head)
            else:
                self.send_page(200, "application/xml", body, {}, head)

    def set_urls(self, path: str, count: int) -> None:
        locs = "".join(f"<url><loc>{self.url}/item/{i}</loc></url>" for i in range(count))
        self.pages[path] = (
            '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"{locs}</urlset>").encode()


@pytest.fixture
def site() -> Iterator[SitemapSite]:
    with SitemapSite() as served:
        yield served


def run(redis_url: str, body: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
    async def main() -> T:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def stream_urls(sync_redis: redis.Redis, namespace: str) -> list[str]:
    entries: Any = sync_redis.xrange(KeyLayout(namespace).stream)
    return [ExecTask.from_message(fields).url for _, fields in entries]


def list_seed(seed_id: str = "list", schedule: Any = "every 1h", **payload: Any) -> SeedTask:
    return SeedTask(seed_id=seed_id, site_id="news", task_type="url_list",
                    payload=payload or {"urls": ["https://news.example/latest"]},
                    schedule=schedule)


def loopback(site_id: str) -> FetchPolicy:
    """SitemapSite serves on 127.0.0.1: METEORSEED_FETCH_PRIVATE_ADDRESSES=True."""
    return FetchPolicy(private_addresses=True, site_id=site_id)


def sitemap_seed(site: SitemapSite, schedule: Any, seed_id: str = "map") -> SeedTask:
    return SeedTask(seed_id=seed_id, site_id="news", task_type="sitemap",
                    payload={"url": f"{site.url}/sitemap.xml"}, schedule=schedule)


async def run_now(seeder: Seeder, seed_id: str) -> RunResult:
    """Run the seed now, whenever it is due (the loop claims it first)."""
    record = await seeder.registry.get(seed_id)
    assert record is not None
    return await seeder.run_seed(record)


def test_own_pages_are_refetched_and_sitemap_items_stay_deduplicated(
        redis_url: str, namespace: str, site: SitemapSite, sync_redis: redis.Redis) -> None:
    site.set_urls("/sitemap.xml", 5)

    async def body(client: aioredis.Redis) -> list[RunResult]:
        seeder = Seeder(client, KeyLayout(namespace), sitemaps=loopback)
        await seeder.registry.put(list_seed())
        await seeder.registry.put(sitemap_seed(site, "every 1h"))
        return [await run_now(seeder, seed_id)
                for seed_id in ("list", "map", "list", "map")]

    _, map1, list2, map2 = run(redis_url, body)
    urls = stream_urls(sync_redis, namespace)
    assert urls.count("https://news.example/latest") == 2  # re-fetched on each run
    assert sorted(set(urls) - {"https://news.example/latest"}) == sorted(
        f"{site.url}/item/{i}" for i in range(5))  # items once
    assert (map1.summary.enqueued, map2.summary.enqueued, map2.summary.duplicates) == (5, 0, 5)
    assert map1.record and map1.record.last_yield == 5 and map2.record
    assert map2.record.last_yield == 0 and map2.record.runs == 2
    assert list2.record and list2.record.last_enqueued == 1 and list2.record.last_yield == 0


def test_adaptive_interval_follows_real_yield_within_bounds(
        redis_url: str, namespace: str, site: SitemapSite) -> None:
    bounds = Bounds(60, 3600)

    async def body(client: aioredis.Redis) -> list[float]:
        seeder = Seeder(client, KeyLayout(namespace), bounds_for=lambda site_id: bounds,
                        sitemaps=loopback)
        await seeder.registry.put(sitemap_seed(site, "every 10m"))
        intervals = []
        count = 0
        for growth in (300, 300, 300) + (0,) * 10:
            count += growth
            site.set_urls("/sitemap.xml", count)
            result = await run_now(seeder, "map")
            assert result.record is not None and result.record.interval_s is not None
            assert result.record.last_yield == growth
            intervals.append(result.record.interval_s)
        return intervals

    intervals = run(redis_url, body)
    assert intervals[2] < intervals[0] < 600  # many new items: shorter
    assert min(intervals) >= 60 and max(intervals) <= 3600  # within the bounds
    assert intervals[-1] == 3600  # none: longer, to the max (once the mean yield decays)
    assert sorted(intervals[3:]) == intervals[3:]  # never shorter while nothing is found


def test_failing_seed_is_visible_and_backs_off(redis_url: str, namespace: str,
                                               site: SitemapSite) -> None:
    async def body(client: aioredis.Redis) -> list[SeedRecord]:
        seeder = Seeder(client, KeyLayout(namespace),
                        bounds_for=lambda site_id: Bounds(60, 600), sitemaps=loopback)
        await seeder.registry.put(sitemap_seed(site, "every 1m"))  # no sitemap there: 404
        records = []
        for _ in range(3):
            result = await run_now(seeder, "map")
            assert not result.ok and result.record is not None
            records.append(result.record)
        return records

    records = run(redis_url, body)
    assert [r.failures for r in records] == [1, 2, 3]
    assert all("404" in (r.last_error or "") for r in records), records[-1].last_error
    assert records[-1].status == "failing" and records[-1].last_success is None
    waits = [r.next_due - r.last_run for r in records]  # type: ignore[operator]
    assert waits[0] < waits[1] < waits[2] <= 4 * 600 + 5


def test_a_stored_seed_with_a_field_its_type_lacks_fails_its_run_by_name(
        redis_url: str, namespace: str, sync_redis: redis.Redis, site: SitemapSite,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A seed registered before payload fields were checked (put here with the check off)
    runs no more: its run fails naming the field, and nothing is enqueued; the whole sitemap
    is not crawled in place of the part its misspelt ``lastmod_after`` asked for."""
    site.set_urls("/sitemap.xml", 3)
    seed = SeedTask(seed_id="map", site_id="news", task_type="sitemap", schedule="every 1m",
                    payload={"url": f"{site.url}/sitemap.xml", "lastmod_since": "2024-01-01"})

    async def body(client: aioredis.Redis) -> RunResult:
        seeder = Seeder(client, KeyLayout(namespace),
                        bounds_for=lambda site_id: Bounds(60, 600), sitemaps=loopback)
        with monkeypatch.context() as older:
            older.setattr("meteorseed_scrapy.seeding.registry.check_payload", lambda seed: None)
            await seeder.registry.put(seed)
        return await run_now(seeder, "map")

    result = run(redis_url, body)
    assert not result.ok and result.record is not None
    assert "payload.lastmod_since: is not a field of a sitemap payload" in (
        result.record.last_error or ""), result.record.last_error
    assert stream_urls(sync_redis, namespace) == []


def test_a_keyword_added_takes_effect_at_once(redis_url: str, namespace: str,
                                              sync_redis: redis.Redis) -> None:
    def keywords(*words: str) -> SeedTask:
        return SeedTask(seed_id="kw", site_id="news", task_type="keywords", schedule="every 1d",
                        payload={"search_template": "https://news.example/s?q={keyword}",
                                 "keywords": list(words)})

    async def body(client: aioredis.Redis) -> float:
        seeder = Seeder(client, KeyLayout(namespace), config=SeederConfig(poll_s=0.2))
        await seeder.registry.put(keywords("rust"))
        stop = asyncio.Event()
        loop = asyncio.ensure_future(seeder.run(stop))
        try:
            await wait_until(lambda: seeder.runs >= 1)
            started = time.monotonic()
            await seeder.registry.put(keywords("rust", "python"))  # an edit, mid-schedule
            await wait_until(lambda: seeder.runs >= 2)
            return time.monotonic() - started
        finally:
            stop.set()
            await loop

    run(redis_url, body)  # (not a day later: the loop above would time the test out)
    assert stream_urls(sync_redis, namespace) == [
        "https://news.example/s?q=rust", "https://news.example/s?q=rust",
        "https://news.example/s?q=python"]


def test_two_seeders_never_run_one_seed_at_once(redis_url: str, namespace: str) -> None:
    in_flight: set[str] = set()
    overlaps: list[str] = []
    runs: list[str] = []

    class SlowSeeder(Seeder):
        async def run_seed(self, record: SeedRecord) -> RunResult:
            if record.seed_id in in_flight:
                overlaps.append(record.seed_id)
            in_flight.add(record.seed_id)
            try:
                await asyncio.sleep(0.02)  # let the other seeder try to claim it meanwhile
                return await super().run_seed(record)
            finally:
                in_flight.discard(record.seed_id)
                runs.append(record.seed_id)

    async def body(client: aioredis.Redis) -> None:
        keys = KeyLayout(namespace)
        registry = SeedRegistry(client, keys)
        for i in range(20):
            await registry.put(list_seed(f"once{i}", schedule=None))  # run exactly once each
        for i in range(3):
            await registry.put(list_seed(f"often{i}", schedule={"every": 1, "min": 1, "max": 1}))
        other = aioredis.Redis.from_url(redis_url)
        config = SeederConfig(poll_s=0.1, claim_limit=2)
        seeders = [SlowSeeder(client, keys, config=config), SlowSeeder(other, keys, config=config)]
        stop = asyncio.Event()
        loops = [asyncio.ensure_future(s.run(stop)) for s in seeders]
        try:
            await wait_until(lambda: sum(r.startswith("often") for r in runs) >= 9)
        finally:
            stop.set()
            await asyncio.gather(*loops)
            await other.aclose()
        assert all(s.runs for s in seeders)  # both took part

    run(redis_url, body)
    assert overlaps == []
    assert sorted(r for r in runs if r.startswith("once")) == sorted(f"once{i}" for i in range(20))


def test_stop_during_a_blocked_run_hands_the_seed_back(redis_url: str, namespace: str,
                                                       sync_redis: redis.Redis) -> None:
    async def body(client: aioredis.Redis) -> tuple[SeedRecord | None, float]:
        keys = KeyLayout(namespace)
        await client.xadd(keys.stream, {"v": "1", "t": "{}"})  # a backlog of 1 ...
        waiting = asyncio.Event()
        seeder = Seeder(client, keys, config=SeederConfig(max_backlog=0, grace_s=0.2,
                                                          poll_s=0.1),  # ... is too much
                        on_wait=lambda backlog: waiting.set())
        await seeder.registry.put(list_seed())
        stop = asyncio.Event()
        loop = asyncio.ensure_future(seeder.run(stop))
        await asyncio.wait_for(waiting.wait(), 60)  # claimed, now waiting for room
        stop.set()
        await asyncio.wait_for(loop, 10)
        secs, usecs = await client.time()
        return await seeder.registry.get("list"), int(secs) + int(usecs) / 1e6

    record, now = run(redis_url, body)
    assert record is not None and record.runs == 0  # nothing recorded: it did not run
    assert record.next_due is not None and record.next_due <= now  # due again, at once


def test_a_slow_sitemap_keeps_its_lease_and_the_loop_free(
        redis_url: str, namespace: str, site: SitemapSite, sync_redis: redis.Redis) -> None:
    site.set_urls("/sitemap.xml", 3)
    site.delay = 2.5  # longer than the lease: only renewals keep it
    keys = KeyLayout(namespace)
    margins: list[float] = []
    watching = threading.Event()

    def watch_lease() -> None:  # on its own thread and connection: sees what another seeder would
        while watching.is_set():
            score = sync_redis.zscore(keys.seeds_due, "map")
            secs, usecs = sync_redis.time()
            if score is not None:
                margins.append(float(score) - (secs + usecs / 1e6))
            time.sleep(0.05)

    async def body(client: aioredis.Redis) -> tuple[RunResult, int]:
        seeder = Seeder(client, keys, config=SeederConfig(lease_s=1.0), sitemaps=loopback)
        await seeder.registry.put(sitemap_seed(site, "every 1h"))
        [record] = await seeder.registry.claim_due(None, 1, 1.0)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        watching.set()
        watcher = threading.Thread(target=watch_lease)
        watcher.start()
        try:
            result = await seeder.run_seed(record)
        finally:
            watching.clear()
            watcher.join()
            ticker.cancel()
        return result, ticks

    result, ticks = run(redis_url, body)
    assert result.ok and result.summary.enqueued == 3
    assert ticks >= 5  # the event loop kept running during the fetch (blocked: 1 tick)
    assert len(margins) > 10 and min(margins) > 0, margins  # leased all along


def test_redis_outage_pauses_with_one_line_and_resumes(
        namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "meteorseed_scrapy.seeding")
    server = RedisServer().start()

    async def body() -> int:
        client = aioredis.Redis.from_url(server.url, socket_connect_timeout=1)
        seeder = Seeder(client, KeyLayout(namespace),
                        config=SeederConfig(poll_s=0.1, retry_s=0.2))
        await seeder.registry.put(list_seed(schedule={"every": 1, "min": 1, "max": 1}))
        stop = asyncio.Event()
        looks = 0  # the seeder's looks at the due set: one per attempt while Redis is away

        def look() -> None:
            nonlocal looks
            looks += 1

        loop = asyncio.ensure_future(seeder.run(stop, before_claim=look))
        try:
            await wait_until(lambda: seeder.runs >= 1)
            server.stop()
            down_at = looks
            await wait_until(lambda: looks >= down_at + 10)  # 10 failed attempts
            assert not loop.done()
            server.start()
            await client.set("x", 1)  # (a fresh, empty Redis: register the seed again)
            await seeder.registry.put(list_seed(schedule={"every": 1, "min": 1, "max": 1}))
            before = seeder.runs
            await wait_until(lambda: seeder.runs >= before + 1)
            return seeder.runs
        finally:
            stop.set()
            await loop
            await client.aclose()

    try:
        assert asyncio.run(body()) >= 2
    finally:
        server.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis unavailable" in line for line in lines) == 1, lines
    assert sum("Redis is back" in line for line in lines) == 1, lines


# -- as real processes ---------------------------------------------------------------------------

def _registry_runs(sync_redis: redis.Redis, namespace: str, seed_id: str) -> int:
    return int(sync_redis.hget(KeyLayout(namespace).seed(seed_id), "runs") or 0)


def _write_seeds(path: Path, site: SitemapSite) -> None:
    fast = {"every": "1s", "min": "1s", "max": "1s"}
    lines = [
        {"seed_id": "list", "site_id": "news", "task_type": "url_list",
         "payload": {"urls": ["https://news.example/latest"]}, "schedule": fast},
        {"seed_id": "map", "site_id": "news", "task_type": "sitemap",
         "payload": {"url": f"{site.url}/sitemap.xml"}, "schedule": fast},
        {"seed_id": "bad", "site_id": "news", "task_type": "url_list",
         "payload": {"urls": ["https://news.example/"]}, "schedule": "every now and then"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("how", ["scrapy", "meteorseed"])
def test_watch_process_runs_due_seeds_until_sigterm(
        how: str, redis_url: str, namespace: str, site: SitemapSite, sync_redis: redis.Redis,
        tmp_path: Path) -> None:
    site.set_urls("/sitemap.xml", 3)
    seeds = tmp_path / "seeds.jsonl"
    _write_seeds(seeds, site)
    if how == "scrapy":
        cmd = [str(BIN / "scrapy"), "seed-expand", "--watch", str(seeds),
               "-s", f"METEORSEED_REDIS_URL={redis_url}", "-s", f"METEORSEED_NAMESPACE={namespace}",
               "-s", "METEORSEED_FETCH_PRIVATE_ADDRESSES=True"]
    else:
        cmd = [str(BIN / "meteorseed"), "seeder", str(seeds), "--redis-url", redis_url,
               "--namespace", namespace]
    env = {k: v for k, v in os.environ.items() if not k.startswith("METEORSEED_")}
    env["METEORSEED_FETCH_PRIVATE_ADDRESSES"] = "true"  # (the sitemap site is on loopback)
    with running(cmd, cwd=tmp_path, env=env) as proc:
        wait_for(lambda: _registry_runs(sync_redis, namespace, "map") >= 2
                  and _registry_runs(sync_redis, namespace, "list") >= 2)
        site.set_urls("/sitemap.xml", 5)  # two new items appear
        wait_for(lambda: len(set(stream_urls(sync_redis, namespace))) == 6)
        err = terminate(proc)
    assert proc.returncode == 0, err
    urls = stream_urls(sync_redis, namespace)
    assert urls.count("https://news.example/latest") >= 2  # expanded on every run
    assert sorted(u for u in urls if "/item/" in u) == sorted(
        f"{site.url}/item/{i}" for i in range(5))  # each item once
    assert "line 3: schedule.every:" in err
    assert "registered 2, rejected 1" in err and "stopped after" in err
    assert "seeder: seed map: enqueued 3" in err
    if how == "meteorseed":
        listing = subprocess.run(
            [str(BIN / "meteorseed"), "seeder", "--list", "--json", "--redis-url", redis_url,
             "--namespace", namespace], capture_output=True, text=True, env=env, timeout=60)
        assert listing.returncode == 0, listing.stderr
        by_id = {r["seed_id"]: r for r in json.loads(listing.stdout)}
        assert set(by_id) == {"list", "map"} and by_id["map"]["runs"] >= 3
        assert by_id["map"]["status"] == "ok" and by_id["map"]["last_error"] is None


def test_site_bounds_from_rule_files_and_settings(tmp_path: Path) -> None:
    text = (REPO / "example_project/sites/news.yaml").read_text()
    assert "schedule: {every: 6h, priority: 0}" in text
    (tmp_path / "news.yaml").write_text(text.replace(
        "schedule: {every: 6h, priority: 0}", "schedule: {every: 6h, min: 2m, max: 20m}"))
    defaults = runner.bounds_from({"METEORSEED_SCHEDULE_MIN_INTERVAL": "300",
                                   "METEORSEED_SCHEDULE_MAX_INTERVAL": "3h"}.get)
    assert defaults == Bounds(300, 10800)
    assert runner.bounds_from(dict[str, str]().get) == Bounds(600, 7200)
    with pytest.raises(ValueError, match="METEORSEED_SCHEDULE_MIN_INTERVAL"):
        runner.bounds_from({"METEORSEED_SCHEDULE_MIN_INTERVAL": "soon"}.get)
    with pytest.raises(ValueError, match="must not be above"):
        runner.bounds_from({"METEORSEED_SCHEDULE_MIN_INTERVAL": "3h"}.get)
    sites = SiteConfigs(str(tmp_path))
    asyncio.run(sites.refresh())
    bounds = runner.bounds_for(sites, defaults)
    site_id = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                   if line.startswith("site_id:"))
    assert bounds(site_id) == Bounds(120, 1200)
    assert bounds("unknown_site") == defaults
    assert runner.bounds_for(SiteConfigs(), defaults)("x") == defaults
    # The same rule files keep a seed's URLs inside the site's allowed domains.
    assert sites.rejects(site_id, "https://elsewhere.invalid/x") is not None
    assert sites.rejects("unknown_site", "https://elsewhere.invalid/x") is None


def test_a_seed_url_outside_its_sites_domains_is_rejected_by_position(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    def rejects(site_id: str, url: str) -> str | None:
        return "outside news.example" if "news.example" not in url else None

    async def body(client: aioredis.Redis) -> RunResult:
        seeder = Seeder(client, KeyLayout(namespace), rejects=rejects)
        await seeder.registry.put(list_seed(urls=["https://news.example/a", "https://x.test/b"]))
        return await run_now(seeder, "list")

    result = run(redis_url, body)
    assert stream_urls(sync_redis, namespace) == ["https://news.example/a"]
    assert (result.summary.enqueued, result.summary.rejected) == (1, 1)
    assert result.ok  # one bad URL does not fail the seed


def test_a_run_ends_though_its_lease_renewal_swallowed_the_cancel(
        redis_url: str, namespace: str, site: SitemapSite,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-py 8.2 can swallow a cancellation that lands while a command is in flight: the
    renewal loop must end all the same once the run is over (seen as this file's slow-sitemap
    test hanging for 300 s under load)."""
    site.set_urls("/sitemap.xml", 2)
    site.delay = 0.5  # the run outlasts the first renewal's start (lease/3 = 0.02 s)
    keys = KeyLayout(namespace)
    swallowed = []

    async def body(client: aioredis.Redis) -> RunResult:
        seeder = Seeder(client, keys, config=SeederConfig(lease_s=0.06), sitemaps=loopback)
        await seeder.registry.put(sitemap_seed(site, "every 1h"))
        [record] = await seeder.registry.claim_due(None, 1, 1.0)

        async def renew_in_flight(seed_id: str, lease_s: float) -> bool:
            try:
                # A command that answers only long after the run: the run's cancel lands
                # inside it, whatever the machine's load (not in the wait between two).
                await asyncio.sleep(300)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(seed_id)  # as redis-py may: once, the cancel is lost
            return True

        monkeypatch.setattr(seeder.registry, "renew", renew_in_flight)
        running = asyncio.ensure_future(seeder.run_seed(record))
        await asyncio.wait([running], timeout=30)  # (a bound, not a pace: it ends in ~1 s)
        assert running.done(), "the run waits for ever for its lease renewal to end"
        return running.result()

    result = run(redis_url, body)
    assert result.ok and result.summary.enqueued == 2
    assert swallowed == ["map"]  # the cancel did land inside a renewal, and was lost

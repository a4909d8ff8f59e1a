"""The keep-alive of a live worker and its tasks runs off the reactor (its own thread and Redis
client): a slow download or a callback that blocks the reactor for several CLAIM_IDLEs is never
reclaimed, neither as idle nor as a dead worker's (its heartbeat goes on), while a dead worker's
tasks still are after CLAIM_IDLE (tests/test_liveness.py: at once when it is listed dead)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delivery import Ref
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from meteorseed_scrapy.worker import keepalive
from meteorseed_scrapy.worker.keepalive import KeepAlive, touch_interval
from tests.e2e_helpers import REPO, enqueue, stored_docs
from tests.subprocess_env import python_path

CLAIM_IDLE = 0.5  # seconds, for the unit tests


def _held(redis_url: str, keys: KeyLayout, n: int, consumer: str = "a") -> list[Ref]:
    """``n`` entries read (so pending) by ``consumer``."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    for i in range(n):
        r.xadd(keys.stream, {"i": str(i)})

    async def read() -> list[Ref]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            c = StreamConsumer(client, keys, consumer)
            await c.ensure_group()
            return [d.ref for d in await c.read(n, 0)]
        finally:
            await client.aclose()

    refs = asyncio.run(read())
    assert len(refs) == n
    return refs


def _reclaim(redis_url: str, keys: KeyLayout, min_idle_s: float, consumer: str = "b"
             ) -> list[Ref]:
    async def go() -> list[Ref]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            return [d.ref for d in
                    await StreamConsumer(client, keys, consumer).reclaim(min_idle_s, 100)]
        finally:
            await client.aclose()

    return asyncio.run(go())


def _keeper(redis_url: str, keys: KeyLayout, refs: list[Ref]) -> KeepAlive:
    # The thread only reads the consumer's key layout: it touches with a client of its own.
    keeper = KeepAlive(StreamConsumer(redis.Redis.from_url(redis_url), keys, "a"), redis_url,
                       CLAIM_IDLE)
    keeper.hand(refs)
    keeper.start()
    return keeper


def test_touches_go_on_while_no_event_loop_runs(redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    refs = _held(redis_url, keys, 3)
    keeper = _keeper(redis_url, keys, refs)
    try:
        # No event loop runs here at all (as when a callback blocks the reactor): rounds of
        # touches covering several CLAIM_IDLEs go by...
        wait_for(lambda: keeper.touches >= 15, 30, 0.01)
        # ...and another worker finds nothing idle for CLAIM_IDLE.
        assert _reclaim(redis_url, keys, CLAIM_IDLE) == []
    finally:
        keeper.stop()
    # Without the keep-alive the same entries are reclaimed after CLAIM_IDLE (a dead worker).
    got = wait_for(lambda: _reclaim(redis_url, keys, CLAIM_IDLE), 30, 0.05)
    assert sorted(got) == sorted(refs)


def test_an_entry_taken_over_is_reported_and_not_taken_back(
        redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    refs = _held(redis_url, keys, 2)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.xclaim(keys.stream, keys.group, "b", 0, [refs[0][1]], justid=True)
    r.xack(keys.stream, keys.group, refs[1][1])
    keeper = _keeper(redis_url, keys, refs)
    try:
        lost: list[Ref] = []
        wait_for(lambda: lost.extend(keeper.take_lost()) or set(lost) >= set(refs), 30, 0.02)
    finally:
        keeper.stop()
    rows = {p["message_id"]: p["consumer"] for p in
            r.xpending_range(keys.stream, keys.group, "-", "+", 10)}
    assert rows == {refs[0][1]: "b"}  # the keep-alive did not claim it back, nor the acked one


def test_a_snapshot_not_renewed_for_long_stops_the_touches(
        redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reactor stuck for good is a dead worker: its tasks go to others."""
    monkeypatch.setattr(keepalive, "STALE_S", 0.2)
    keys = KeyLayout(namespace)
    refs = _held(redis_url, keys, 1)
    keeper = _keeper(redis_url, keys, refs)
    try:
        assert wait_for(lambda: _reclaim(redis_url, keys, CLAIM_IDLE), 30, 0.05) == refs
    finally:
        keeper.stop()


def test_an_empty_snapshot_and_a_redis_that_is_away_are_survived(
        namespace: str, refused_port: int) -> None:
    keys = KeyLayout(namespace)
    keeper = _keeper(f"redis://127.0.0.1:{refused_port}/0", keys,
                     [(keys.stream, "1-0")])
    try:
        wait_for(lambda: keeper.failures >= 3, 30, 0.02)  # rounds that fail: it goes on
        assert keeper._thread is not None and keeper._thread.is_alive()
        assert keeper.touches == 0 and keeper.take_lost() == []
    finally:
        keeper.stop()
    assert not keeper._thread.is_alive()


def test_five_touches_per_claim_idle_and_the_default_is_ten_seconds() -> None:
    assert DEFAULTS["METEORSEED_CLAIM_IDLE"] == 10
    assert touch_interval(10) == 2.0


def test_the_keepalive_lists_its_worker_and_beats_with_no_task_to_touch(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    """The keep-alive lists its worker at once, and beats without any task to touch."""
    keys = KeyLayout(namespace)
    keeper = _keeper(redis_url, keys, [])
    try:
        wait_for(lambda: keeper.beats >= 3, 30, 0.01)
        assert sync_redis.zscore(keys.workers, "a") is not None
        assert keeper.touches == 0
    finally:
        keeper.stop()


# -- real workers -----------------------------------------------------------------------------

SPIDER = textwrap.dedent('''
    import json, time
    from urllib.parse import parse_qs, urlparse
    import scrapy

    class KeepAliveSpider(scrapy.Spider):
        name = "keepalive"

        def parse(self, response):
            q = parse_qs(urlparse(response.url).query)
            # Blocks the reactor, as a CPU-heavy callback would: no asyncio loop runs meanwhile.
            time.sleep(int(q.get("block", ["0"])[0]) / 1000)
            yield {"unique_key": response.url, "status": response.status}

        def closed(self, reason):
            with open(self.settings.get("KEEPALIVE_STATS"), "w") as fh:
                json.dump(self.crawler.stats.get_stats(), fh, default=str)
''')


class _Worker:
    def __init__(self, tmp: Path, name: str, redis_url: str, ns: str, store: Path,
                 **settings: Any) -> None:
        spider = tmp / "keepalive_spider.py"
        spider.write_text(SPIDER)
        self.log, self.stats_path = tmp / f"{name}.log", tmp / f"{name}.json"
        base = {
            "ADDONS": json.dumps({"meteorseed_scrapy.addon.MeteorSeedAddon": 0}),
            "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": ns,
            "METEORSEED_STORE_URI": f"sqlite:///{store}", "METEORSEED_CONSUMER": name,
            "METEORSEED_IDLE_CLOSE": 3, "METEORSEED_SITE_RATE": 1000,
            "METEORSEED_SITE_BURST": 1000, "METEORSEED_SITE_CONCURRENCY": 100,
            "ROBOTSTXT_OBEY": False, "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "INFO",
            "LOG_FILE": str(self.log), "KEEPALIVE_STATS": str(self.stats_path),
            "DOWNLOAD_TIMEOUT": 180,
        }
        base.update(settings)
        args = [sys.executable, "-m", "scrapy.cmdline", "runspider", str(spider)]
        for key, value in base.items():
            args += ["-s", f"{key}={value}"]
        env = dict(os.environ, PYTHONPATH=python_path(REPO))
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        self.proc = subprocess.Popen(args, cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def stats(self, timeout: float) -> dict[str, Any]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = -9
        log = self.log.read_text(errors="replace") if self.log.exists() else ""
        assert code == 0, log[-4000:]
        return dict(json.loads(self.stats_path.read_text()))


def _pending(r: redis.Redis, keys: KeyLayout) -> int:
    try:
        return int(r.xpending(keys.stream, keys.group)["pending"])
    except redis.ResponseError:  # no group yet: the worker is starting
        return 0


def _slow_worker_keeps_its_tasks(tmp_path: Path, redis_url: str, namespace: str,
                                 claim_idle: float | None, download_ms: int, block_ms: int,
                                 each: int) -> None:
    keys = KeyLayout(namespace)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    store = tmp_path / "items.db"
    with DemoSite() as site:
        urls = [f"{site.url}/slow/{download_ms}?n={i}" for i in range(each)]
        urls += [f"{site.url}/slow/1?block={block_ms}&n={i}" for i in range(each)]
        tasks = enqueue(redis_url, namespace, urls)
        settings: dict[str, Any] = {"CONCURRENT_REQUESTS": 8}
        if claim_idle is not None:
            settings["METEORSEED_CLAIM_IDLE"] = claim_idle
        slow = _Worker(tmp_path, "slow", redis_url, namespace, store, **settings)
        # Every task is the slow worker's before the other one starts looking for idle ones.
        wait_for(lambda: _pending(r, keys) == len(urls), 60, 0.05)
        # Listed in the live-worker registry: the dead-worker path is in play too.
        assert r.zscore(keys.workers, "slow") is not None
        other = _Worker(tmp_path, "other", redis_url, namespace, store, **settings)
        timeout = (download_ms + each * block_ms) / 1000 + 90
        slow_stats, other_stats = slow.stats(timeout), other.stats(timeout)
    # Reclaimed by nobody (not even the slow worker itself, once its reactor ran again).
    assert other_stats.get("meteorseed/reclaimed", 0) == 0
    assert slow_stats.get("meteorseed/reclaimed", 0) == 0
    assert slow_stats.get("meteorseed/acked") == len(urls)
    assert other_stats.get("meteorseed/acked", 0) == 0
    docs = stored_docs(store)
    assert sorted(d["unique_key"] for d in docs.values()) == sorted(urls)
    assert sorted(d["task_id"] for d in docs.values()) == sorted(t.task_id for t in tasks)
    assert r.xlen(keys.stream) == 0
    assert r.zrange(keys.workers, 0, -1) == []  # both left the registry as they stopped


@pytest.mark.e2e
def test_slow_downloads_and_a_blocking_callback_are_not_reclaimed(
        tmp_path: Path, redis_url: str, namespace: str) -> None:
    """Scaled down: downloads of 3 CLAIM_IDLEs and callbacks blocking the reactor for 2.5."""
    _slow_worker_keeps_its_tasks(tmp_path, redis_url, namespace, 2, 6000, 5000, each=2)


@pytest.mark.e2e
def test_a_60s_download_and_a_30s_blocking_callback_with_the_default_claim_idle(
        tmp_path: Path, redis_url: str, namespace: str) -> None:
    """The real figures, with the default METEORSEED_CLAIM_IDLE (about 70 s)."""
    _slow_worker_keeps_its_tasks(tmp_path, redis_url, namespace, None, 60_000, 30_000, each=1)


# -- cost stays flat (the soak found this) ------------------------------------------------------

def test_a_healthy_sites_breaker_window_stays_bounded() -> None:
    """Every download is recorded in its site's local window; on a site that never fails the
    window was never pruned (only failures read it), so a worker grew by one entry per task."""
    from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig

    b = Breaker(redis.Redis(), KeyLayout("ns"), BreakerConfig(window=0.05), None)
    for _ in range(100):
        b.record("site", False, 0.01, False, "t")
    wait_for(lambda: time.monotonic() - b._local["site"].entries[-1][0] > 0.05, 5, 0.01)
    b.record("site", False, 0.01, False, "t")
    assert len(b._local["site"].entries) == 1  # the 100 older than the window went
    assert not b.local_abnormal("site")

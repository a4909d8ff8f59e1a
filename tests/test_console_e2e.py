"""The web console end to end in headless Chromium: token, submit a seed, see its tasks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from tests.api_helpers import TOKEN, ApiServer, stream_tasks
from tests.console_browser import console_page, log_in, needs_chromium, unexpected

pytestmark = needs_chromium


async def _console_flow(base: str, sync_redis: redis.Redis, namespace: str) -> dict[str, Any]:
    from playwright.async_api import expect

    seen: dict[str, Any] = {"dialogs": [], "console_errors": []}
    async with console_page(base, errors=seen["console_errors"],
                            dialogs=seen["dialogs"]) as page:
        # No token yet: the login form, no data.
        await expect(page.locator("#login")).to_be_visible()
        await log_in(page, "wrong")
        await expect(page.locator("#flash")).to_contain_text("Token refused")
        await expect(page.locator("#login")).to_be_visible()

        await log_in(page, TOKEN)
        await expect(page.locator("[data-testid=backlog]")).to_have_text("0")

        # Submit a seed whose URLs would be markup if rendered as HTML.
        await page.click("nav a[data-page=submit]")
        await page.fill("#seed-id", "console-seed")
        await page.fill("#seed-site", "console_site")
        urls = ["https://console.example/a", "https://console.example/b?x=<b>bold</b>",
                "https://console.example/c\"><img/src=x/onerror=alert(1)>",
                "javascript:alert(1)"]
        await page.fill("#seed-payload", "\n".join(urls))
        await page.click("#seed-submit")
        await expect(page.locator("#seed-result-summary")).to_have_text(
            "enqueued 3, duplicates 0, rejected 1")
        await expect(page.locator("#seed-result ul.errors")).to_contain_text(
            "payload.urls[3]")

        # The overview shows the tasks: backlog 3, the seed with 3 tasks enqueued.
        await page.click("nav a[data-page=overview]")
        await expect(page.locator("[data-testid=backlog]")).to_have_text("3")
        row = page.locator("#overview-seeds tr", has_text="console-seed")
        await expect(row.locator("td.seed-enqueued")).to_have_text("3")

        # A dead letter whose URL carries markup: listed as text, inspected, requeued.
        task = {"task_id": "dl1", "seed_id": "console-seed", "site_id": "quiet",
                "url": "https://quiet.example/<img/src=x/onerror=alert(2)>",
                "created_at": 1.0}
        sync_redis.xadd(KeyLayout(namespace).dead, {"t": json.dumps(task),
                                                    "reason": "<b>gave up</b>",
                                                    "deliveries": "5", "at": "1"})
        await page.click("nav a[data-page=dead]")
        cell = page.locator("#dead-table td.url").first
        await expect(cell).to_have_text(task["url"])
        assert await page.locator("#dead-table img").count() == 0
        await page.click("#dead-table button:has-text('Inspect')")
        await expect(page.locator("#dead-detail")).to_contain_text('"task_id": "dl1"')
        await page.click("#dead-table button:has-text('Requeue')")
        await expect(page.locator("#flash")).to_contain_text("Requeued")
        await expect(page.locator("#dead-table")).to_contain_text("No dead letters")

        # A site's fleet-wide adaptive state (its id from Redis: shown as text, not markup).
        keys = KeyLayout(namespace)
        sync_redis.zadd(keys.adaptive_sites, {"<img src=x>": 1})
        sync_redis.hset(keys.site("<img src=x>", "adaptive"), mapping={"delay": "250",
                                                                      "latency": "500"})
        await page.click("nav a[data-page=sites]")
        await expect(page.locator("#sites-table")).to_be_visible()
        await expect(page.locator("#sites-adaptive")).to_contain_text("<img src=x>")
        # delay 250 ms: a target of 4 requests per second, in the table's second column
        cells = page.locator("#sites-adaptive tbody tr").first.locator("td")
        await expect(cells.nth(1)).to_have_text("4")
        await expect(cells.nth(2)).to_have_text("500")
        seen["img_tags"] = await page.locator("img").count()
        seen["token_in_storage"] = await page.evaluate(
            "sessionStorage.getItem('meteorseed.token')")
    return seen


def test_console_submit_seed_and_see_its_tasks(api_server: ApiServer, sync_redis: redis.Redis,
                                               namespace: str) -> None:
    with api_server() as server:
        seen = asyncio.run(_console_flow(server.url, sync_redis, namespace))
    assert seen["dialogs"] == []  # no injected script ever ran
    assert unexpected(seen["console_errors"]) == []  # (nor is the wrong token's 401)
    assert seen["img_tags"] == 0
    assert seen["token_in_storage"] == TOKEN
    urls = sorted(t["url"] for t in stream_tasks(sync_redis, namespace))
    assert urls == ["https://console.example/a", "https://console.example/b?x=<b>bold</b>",
                    "https://console.example/c\"><img/src=x/onerror=alert(1)>",
                    "https://quiet.example/<img/src=x/onerror=alert(2)>"]

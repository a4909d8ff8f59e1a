"""The console's "Find a task" page: every element console.js asks for exists in index.html, and
(in headless Chromium, when installed) a lookup by id and by URL shows the state, the dedup
record and what was searched; stored markup stays text; bad input names the field."""

from __future__ import annotations

import asyncio
import os
import re
from importlib import resources
from typing import Any

import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.api_helpers import TOKEN, ApiServer
from tests.console_browser import console_page, log_in, needs_chromium

STATIC = resources.files("meteorseed_scrapy").joinpath("console/static")


def test_every_element_the_script_uses_is_in_the_page() -> None:
    script = STATIC.joinpath("console.js").read_text("utf-8")
    page = STATIC.joinpath("index.html").read_text("utf-8")
    used = set(re.findall(r'\$\("([\w-]+)"\)', script))
    assert {"task-form", "task-query", "task-site", "task-summary", "task-places"} <= used
    ids = set(re.findall(r'\bid="([\w-]+)"', page))
    assert used - ids == set()
    pages = re.search(r"const pages = \[([^\]]*)\]", script)
    assert pages is not None and '"task"' in pages.group(1)
    assert 'data-page="task"' in page and 'id="page-task"' in page


async def _lookups(base: str, task: ExecTask) -> dict[str, Any]:
    from playwright.async_api import expect

    seen: dict[str, Any] = {"dialogs": []}
    async with console_page(base, dialogs=seen["dialogs"]) as page:
        await log_in(page, TOKEN)
        await page.click("nav a[data-page=task]")
        await page.fill("#task-query", task.task_id)
        await page.click("#task-form button[type=submit]")
        await expect(page.locator("[data-testid=task-summary]")).to_have_text(
            "State: waiting")
        await expect(page.locator("#task-places td.url").last).to_have_text(task.url)
        await expect(page.locator("#task-searched")).to_contain_text("every one in full")

        await page.fill("#task-query", task.url)
        await page.fill("#task-site", task.site_id)
        await page.click("#task-form button[type=submit]")
        await expect(page.locator("#page-task")).not_to_have_attribute("aria-busy", "true")
        await expect(page.locator("#task-detail")).to_contain_text('"canonical_url"')
        await expect(page.locator("#task-detail")).to_contain_text(task.task_id)

        await page.fill("#task-query", "ftp://nope.example/")
        await page.click("#task-form button[type=submit]")
        await expect(page.locator("#flash")).to_contain_text("query.url")
        await expect(page.locator("#task-places")).to_be_empty()  # no stale answer
        seen["img_tags"] = await page.locator("img").count()
        await page.screenshot(path=os.environ.get("METEORSEED_SCREENSHOTS", "/tmp")
                              + "/console-task.png")
    return seen


@needs_chromium
def test_find_a_task_by_id_and_url(api_server: ApiServer, sync_redis: redis.Redis,
                                   namespace: str) -> None:
    task = ExecTask.create(seed_id="s", site_id="news",
                           url="https://news.example/<img/src=x/onerror=alert(1)>")
    sync_redis.xadd(KeyLayout(namespace).stream, task.to_message())
    with api_server() as server:
        seen = asyncio.run(_lookups(server.url, task))
    assert seen["dialogs"] == [] and seen["img_tags"] == 0


async def _answers_out_of_order(base: str, task: ExecTask) -> dict[str, Any]:
    """The lookup by URL is held back until the next lookup (a bad URL) has been answered."""
    from playwright.async_api import Route, expect

    held: asyncio.Future[Route] = asyncio.get_running_loop().create_future()

    async def hold(route: Route) -> None:
        if "url=https" in route.request.url:
            held.set_result(route)
        else:
            await route.continue_()

    async with console_page(base) as page:
        await log_in(page, TOKEN)
        await page.click("nav a[data-page=task]")
        await page.route("**/tasks?*", hold)
        await page.fill("#task-query", task.url)
        await page.click("#task-form button[type=submit]")
        slow = await held
        await page.fill("#task-query", "ftp://nope.example/")
        await page.click("#task-form button[type=submit]")
        await expect(page.locator("#flash")).to_contain_text("query.url")
        async with page.expect_response(lambda r: "url=https" in r.url):
            await slow.continue_()
        await expect(page.locator("#page-task")).not_to_have_attribute("aria-busy", "true")
        return {"flash": await page.locator("#flash").text_content(),
                "places": await page.locator("#task-places").inner_html(),
                "detail_hidden": await page.locator("#task-detail").is_hidden()}


@needs_chromium
def test_a_late_answer_to_an_older_lookup_does_not_replace_the_newest(
        api_server: ApiServer, sync_redis: redis.Redis, namespace: str) -> None:
    task = ExecTask.create(seed_id="s", site_id="news", url="https://news.example/a")
    sync_redis.xadd(KeyLayout(namespace).stream, task.to_message())
    with api_server() as server:
        seen = asyncio.run(_answers_out_of_order(server.url, task))
    assert "query.url" in (seen["flash"] or "")
    assert seen["places"] == "" and seen["detail_hidden"]

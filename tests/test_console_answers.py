"""The console's answers arriving out of order (in headless Chromium, when installed): a page
never shows an answer older than the one it shows, nor an answer to a query asked before
another query; an answer slower than the refresh interval still shows; the page is aria-busy
while a query is in flight. ``newest()`` of console.js is driven with promises the test settles
in the order it chooses. A query that hangs fails at its deadline, and no refresh is asked while
it hangs (Playwright's fake clock runs the page's timers)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.api_helpers import TOKEN, ApiServer
from tests.console_browser import console_page, log_in, needs_chromium

# Each case: the queries asked, in order (their keys), then the order their answers come back;
# the result is the queries whose answers were rendered, in rendering order.
CASES = {
    "in order": (["", ""], [0, 1], [0, 1]),
    "a refresh overtaken by a newer one": (["", ""], [1, 0], [1]),
    "every refresh slow, each still shows": (["", "", ""], [0, 1, 2], [0, 1, 2]),
    "an older lookup answered late": (["a", "b"], [1, 0], [1]),
    "an older lookup answered first": (["a", "b"], [0, 1], [1]),
    "the same lookup asked again": (["a", "b", "a"], [2, 0, 1], [2]),
}

DRIVE = """async ([page, keys, order]) => {
  const settle = [];
  const rendered = [];
  const busy = [];
  const runs = keys.map((key, i) => newest(page, key,
    () => new Promise((resolve) => { settle[i] = resolve; }),
    () => rendered.push(i)));
  busy.push(document.getElementById(`page-${page}`).getAttribute("aria-busy"));
  for (const i of order) {
    settle[i]({ answer: i });
    await runs[i];
  }
  busy.push(document.getElementById(`page-${page}`).getAttribute("aria-busy"));
  return { rendered, busy };
}"""


async def _drive(base: str, cases: dict[str, tuple[list[str], list[int], list[int]]]
                 ) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    async with console_page(base) as page:
        await log_in(page, TOKEN)
        for n, (name, (keys, order, _)) in enumerate(cases.items()):
            # a page name of its own per case: no state from the case before
            await page.evaluate(f"() => document.body.append(Object.assign("
                                f"document.createElement('section'), {{id: 'page-case{n}'}}))")
            seen[name] = await page.evaluate(DRIVE, [f"case{n}", keys, order])
    return seen


@needs_chromium
def test_a_page_shows_the_newest_answer_of_its_current_query(api_server: ApiServer) -> None:
    with api_server() as server:
        seen = asyncio.run(_drive(server.url, CASES))
    for name, (_, _, expected) in CASES.items():
        assert seen[name]["rendered"] == expected, name
        assert seen[name]["busy"] == ["true", None], name



async def _a_hung_status(base: str) -> dict[str, Any]:
    from playwright.async_api import Route, expect

    asked: list[str] = []
    hung: list[Route] = []

    async def answer(route: Route) -> None:
        asked.append(route.request.url)
        if len(asked) == 1:
            hung.append(route)  # never answered
        else:
            await route.continue_()

    async with console_page(base) as page:
        await page.clock.install()
        await page.route("**/status", answer)
        await log_in(page, TOKEN)
        await expect(page.locator("#page-overview")).to_have_attribute("aria-busy", "true")
        await page.clock.run_for(10_000)  # five refreshes due while the first query hangs
        during = len(asked)
        await page.clock.run_for(21_000)  # past its deadline
        await expect(page.locator("#flash")).to_contain_text("no answer to GET /status in 30 s")
        await page.clock.run_for(2_000)  # the next refresh
        # (four real queries to the server: Playwright's 5 s may be short on a loaded machine)
        await expect(page.locator("[data-testid=backlog]")).to_have_text("0", timeout=30_000)
        return {"during": during, "after": len(asked)}


@needs_chromium
def test_a_hung_query_fails_at_its_deadline_and_no_refresh_piles_on_it(
        api_server: ApiServer) -> None:
    with api_server() as server:
        seen = asyncio.run(_a_hung_status(server.url))
    assert seen["during"] == 1 and seen["after"] >= 2

"""The console in headless Chromium (/usr/bin/chromium, never a downloaded browser), logged in
with the test token: what the console tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from tests.test_api import TOKEN


@asynccontextmanager
async def logged_in_console(base: str, errors: list[str]) -> AsyncIterator[Any]:
    """A page of the console at ``base``, logged in; console errors go to ``errors``."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path="/usr/bin/chromium",
                                           headless=True, args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            await page.goto(f"{base}/console/")
            await page.fill("#token", TOKEN)
            await page.click("#login-form button[type=submit]")
            yield page
        finally:
            await browser.close()

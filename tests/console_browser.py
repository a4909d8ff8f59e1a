"""The console in headless Chromium (/usr/bin/chromium, never a downloaded browser): what the
console tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from meteorseed_scrapy.sites.render import DEFAULT_CHROMIUM
from tests.api_helpers import TOKEN

if TYPE_CHECKING:
    from playwright.async_api import Page

#: The system's Chromium (DEFAULT_CHROMIUM) resolving no host name: every test's browser.
OFFLINE_CHROMIUM = str(Path(__file__).resolve().parent / "offline_chromium")

needs_chromium = pytest.mark.skipif(
    not Path(DEFAULT_CHROMIUM).exists(),
    reason=f"{DEFAULT_CHROMIUM} is absent (headless Chromium for Playwright)")


@asynccontextmanager
async def console_page(base: str, *, errors: list[str] | None = None,
                       dialogs: list[str] | None = None, **page_options: Any
                       ) -> AsyncIterator[Page]:
    """A page of the console at ``base``, showing its login form; console errors go to
    ``errors``, dialogs' messages to ``dialogs`` (when given)."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=OFFLINE_CHROMIUM, headless=True,
                                           args=["--no-sandbox"])
        try:
            page = await browser.new_page(**page_options)
            if errors is not None:
                page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            if dialogs is not None:
                page.on("dialog", lambda d: dialogs.append(d.message))
            await page.goto(f"{base}/console/")
            yield page
        finally:
            await browser.close()


def unexpected(errors: list[str]) -> list[str]:
    """The console errors but the 401 of the page's first call (made before the login)."""
    return [e for e in errors if "401" not in e]


async def log_in(page: Page, token: str = TOKEN) -> None:
    await page.fill("#token", token)
    await page.click("#login-form button[type=submit]")


@asynccontextmanager
async def logged_in_console(base: str, errors: list[str]) -> AsyncIterator[Page]:
    """A page of the console at ``base``, logged in; console errors go to ``errors``."""
    async with console_page(base, errors=errors) as page:
        await log_in(page)
        yield page

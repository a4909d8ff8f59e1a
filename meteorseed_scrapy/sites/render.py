"""Pages of ``render: browser`` sites go through headless Chromium (scrapy-playwright).

* :func:`configure` (called by the ``sites`` spider's ``update_settings``) installs
  :class:`BrowserHandler` for http/https, :class:`RenderMiddleware`, and capped defaults:
  ``PLAYWRIGHT_MAX_CONTEXTS`` 1, ``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT`` 4, 30 s navigation. The
  browser is the system's Chromium (``METEORSEED_CHROMIUM_PATH``, default ``/usr/bin/chromium``,
  Debian package ``chromium``): Playwright never downloads one.
* :class:`BrowserHandler` is scrapy-playwright's handler with Playwright itself started lazily:
  scrapy-playwright starts Playwright's driver when the engine starts and the browser at the
  first page; here both wait for the first rendered request, so a worker whose sites do not
  render runs neither. Requests without ``meta["playwright"]`` take Scrapy's HTTP/1.1 path.
  The http and https handlers share one browser.
* :class:`RenderMiddleware` marks the requests of a rendering site's tasks for the browser, with
  ``PageMethod("wait_for_selector", wait_for)``. Tasks carry no browser objects (they are JSON):
  the marking happens here, on the worker, just before the download. Pages are closed by the
  handler after every download, failed or not. Without Chromium (or scrapy-playwright) such a
  request fails with :class:`RenderUnavailable` naming the path: its task goes to the dead
  letters with that reason, and the worker's other sites carry on.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

from meteorseed_scrapy.components import add_component
from meteorseed_scrapy.settings import text_setting
from meteorseed_scrapy.sites.lookup import site_configs
from meteorseed_scrapy.task.context import task_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

# Whether the `playwright` extra is installed, without importing it: scrapy-playwright (and
# Playwright) load only when a worker really renders, not in every `scrapy` command that lists
# the spiders (`scrapy list` imports this module through the rule spider).
PLAYWRIGHT_INSTALLED = importlib.util.find_spec("scrapy_playwright") is not None

logger = logging.getLogger(__name__)

DEFAULT_CHROMIUM = "/usr/bin/chromium"
HANDLER = "meteorseed_scrapy.sites.browser.BrowserHandler"
MIDDLEWARE = "meteorseed_scrapy.middlewares.RenderMiddleware"  # (below; its documented path)
#: after the proxy pool (740) and Scrapy's HttpProxyMiddleware (750): only meta is set here
MIDDLEWARE_ORDER = 760
CONTEXT = "meteorseed"  # one browser context for every site: the context cap cannot deadlock
ASYNCIO_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
#: Browser errors (net::ERR_*, timeouts, a crashed page) are retried durably like HTTP ones.
PLAYWRIGHT_ERRORS = "playwright.async_api.Error"
DEFAULTS: dict[str, Any] = {
    "PLAYWRIGHT_BROWSER_TYPE": "chromium",
    "PLAYWRIGHT_MAX_CONTEXTS": 1,
    "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": 4,
    "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT": 30_000,
}

#: What Chromium calls Google for by itself as it starts, Playwright's switches notwithstanding
#: (Debian's build, on a host with a network): its component updater (update.googleapis.com,
#: despite --disable-component-update), its sign-in (accounts.google.com, the account
#: reconciliation a crawler never signs into) and, from Chromium 150, its push messaging's
#: device check-in (android.clients.google.com). Traffic to Google from every render worker, which
#: its operator never asked for: each is sent to the discard port on loopback instead, refused at
#: once. A switch the project passes itself wins.
QUIET_ARGS = (
    "--component-updater=url-source=http://127.0.0.1:9/",
    "--gaia-url=http://127.0.0.1:9/",
    "--gcm-checkin-url=http://127.0.0.1:9/",
    "--gcm-registration-url=http://127.0.0.1:9/",
)


def launch_args(args: Iterable[str]) -> list[str]:
    """A local browser's command-line arguments: the project's (``PLAYWRIGHT_LAUNCH_OPTIONS``'s
    ``args``), then each of :data:`QUIET_ARGS` whose switch the project did not set."""
    args = list(args)
    for quiet in QUIET_ARGS:
        switch = quiet.split("=", 1)[0]
        if not any(arg == switch or arg.startswith(switch + "=") for arg in args):
            args.append(quiet)
    return args


class RenderUnavailable(RuntimeError):
    """A page needs the browser and this worker cannot run one (the message says why)."""


def chromium_path(settings: BaseSettings) -> str:
    """``METEORSEED_CHROMIUM_PATH``, else ``PLAYWRIGHT_LAUNCH_OPTIONS["executable_path"]``,
    else ``/usr/bin/chromium``."""
    launch = settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")
    return str(text_setting(settings, "METEORSEED_CHROMIUM_PATH") or launch.get("executable_path")
               or DEFAULT_CHROMIUM)


def remote_browser(settings: BaseSettings) -> bool:
    """A browser reached over CDP / Playwright's protocol: no local Chromium is needed."""
    return bool(settings.get("PLAYWRIGHT_CDP_URL") or settings.get("PLAYWRIGHT_CONNECT_URL"))


def chromium_missing(path: str) -> str | None:
    """Why ``path`` cannot be the browser, or None when it can."""
    if not os.path.isfile(path):
        return f"Chromium not found at {path}"
    if not os.access(path, os.X_OK):
        return f"Chromium at {path} is not executable"
    return None


def configure(settings: BaseSettings) -> bool:
    """Install the browser handler and the render middleware (spider priority); False when
    scrapy-playwright or the asyncio reactor is missing (rendering sites then fail clearly)."""
    add_component(settings, "DOWNLOADER_MIDDLEWARES", MIDDLEWARE, MIDDLEWARE_ORDER,
                  priority="spider")
    if not PLAYWRIGHT_INSTALLED or settings.get("TWISTED_REACTOR") != ASYNCIO_REACTOR:
        return False
    handlers = settings.getdict("DOWNLOAD_HANDLERS")
    for scheme in ("http", "https"):
        handlers.setdefault(scheme, HANDLER)  # a project's own handler wins
    settings.set("DOWNLOAD_HANDLERS", handlers, priority="spider")
    for name, value in DEFAULTS.items():
        settings.setdefault(name, value)
    retry = settings.getlist("RETRY_EXCEPTIONS")
    if PLAYWRIGHT_ERRORS not in retry:
        settings.set("RETRY_EXCEPTIONS", [*retry, PLAYWRIGHT_ERRORS], priority="spider")
    return True


class RenderMiddleware:
    """Sends the tasks of ``render: browser`` sites through the browser."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.configs = site_configs(crawler)
        settings = crawler.settings
        self.chromium = None if remote_browser(settings) else chromium_path(settings)
        handlers = settings.getdict("DOWNLOAD_HANDLERS")
        self.handler_ready = PLAYWRIGHT_INSTALLED and all(
            _is_browser_handler(handlers.get(s)) for s in ("http", "https"))
        self.default_timeout = settings.getfloat("DOWNLOAD_TIMEOUT", 180)
        self._reported: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RenderMiddleware:
        return cls(crawler)

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        task = task_of(request)
        if task is None or request.meta.get("playwright"):
            return  # robots.txt, warm-up fetches: never rendered
        config = self.configs.get(task.site_id)
        if config is None or config.rendering.mode != "browser":
            return
        problem = self._unavailable()
        if problem is not None:
            self._inc(f"unavailable/{task.site_id}")
            if task.site_id not in self._reported:
                self._reported.add(task.site_id)
                logger.error("Site %s renders with a browser, but %s: its tasks fail (dead"
                             " letters) until this worker can render", task.site_id, problem)
            raise RenderUnavailable(f"site {task.site_id} needs a browser: {problem}")
        from scrapy_playwright.page import PageMethod  # installed: _unavailable() said so

        timeout_ms = (config.limits.timeout or self.default_timeout) * 1000
        request.meta.update({
            "playwright": True,
            "playwright_context": CONTEXT,
            "playwright_page_goto_kwargs": {"timeout": timeout_ms},
            "playwright_page_methods": [PageMethod(
                "wait_for_selector", config.rendering.wait_for, state="attached",
                timeout=timeout_ms)],
        })
        self._inc(f"pages/{task.site_id}")

    def _unavailable(self) -> str | None:
        if not PLAYWRIGHT_INSTALLED:
            return "scrapy-playwright is not installed (the `playwright` extra)"
        if not self.handler_ready:
            return (f"DOWNLOAD_HANDLERS http/https are not {HANDLER} or scrapy-playwright's"
                    f" handler (it needs TWISTED_REACTOR = {ASYNCIO_REACTOR})")
        return None if self.chromium is None else chromium_missing(self.chromium)

    def _inc(self, name: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(f"meteorseed/render/{name}")


def _is_browser_handler(path: Any) -> bool:
    if not PLAYWRIGHT_INSTALLED or path is None:
        return False
    from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler

    try:
        cls = load_object(path) if isinstance(path, str) else path
    except (ImportError, NameError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, ScrapyPlaywrightDownloadHandler)


__all__ = ["RenderMiddleware", "RenderUnavailable", "configure"]

"""The add-on's settings for every crawler a process builds: what ``scrapy_suite.plugin``
installs in the pytest process, and ``subprocess_hook/sitecustomize.py`` in every Python that
process starts (Scrapy's command-line tests run ``scrapy`` in subprocesses).

The one place every crawler passes through (``get_crawler``, ``CrawlerRunner``,
``AsyncCrawlerRunner``, ``CrawlerProcess``, a bare ``Crawler``, Scrapy's commands) is
``Crawler._apply_settings``, which loads the add-ons and freezes the settings, before the first
component is built. The add-on's settings go in there at ``command`` priority, below the
``project`` and ``spider`` priorities the tests use for their own settings, so a test that sets
e.g. ``SCHEDULER`` itself still gets its own.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from scrapy.crawler import Crawler
from scrapy.settings import SETTINGS_PRIORITIES

ADDON = "meteorseed_scrapy.addon.MeteorSeedAddon"
#: The Redis every crawler uses (the plugin's, or the one ``scrapy_suite.run`` started for all
#: the pytest processes of a run); passed on to subprocesses in their environment.
REDIS_URL_ENV = "SCRAPY_SUITE_REDIS_URL"
#: Likewise the directory of the crawlers' SQLite stores.
WORKDIR_ENV = "SCRAPY_SUITE_WORKDIR"
#: More settings for every crawler, as JSON (``{"ROBOTSTXT_OBEY": false}``), at ``project``
#: priority (above the add-on's) unless the test sets them itself: to tell which of the
#: add-on's settings a failure comes from.
SETTINGS_ENV = "SCRAPY_SUITE_SETTINGS"
#: The directory whose ``sitecustomize.py`` installs the same in every Python started with it on
#: ``PYTHONPATH``.
HOOK_DIR = Path(__file__).resolve().parent / "subprocess_hook"
PRIORITY = "command"
IDLE_CLOSE = 1.0
# The suite's mock server is a single site (127.0.0.1): at the add-on's default fleet-wide
# limits (2 requests/s, 4 at a time) the run would take hours. The limiter still runs, at
# limits that leave Scrapy's own concurrency settings (which the tests set) in charge.
POLITENESS = {
    "METEORSEED_SITE_RATE": 10_000.0,
    "METEORSEED_SITE_BURST": 10_000,
    "METEORSEED_SITE_CONCURRENCY": 10_000,
}


def add_settings(crawler: Crawler, redis_url: str, workdir: Path) -> None:
    """The add-on on ``crawler``, with a namespace and a SQLite store of its own."""
    namespace = f"suite-{uuid.uuid4().hex[:12]}"
    settings = crawler.settings
    settings["ADDONS"][ADDON] = 0
    for name, value in {
        "METEORSEED_REDIS_URL": redis_url,
        "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_IDLE_CLOSE": IDLE_CLOSE,
        "METEORSEED_STORE_URI": f"sqlite:///{workdir / namespace}.db",
        **POLITENESS,
    }.items():
        settings.set(name, value, priority=PRIORITY)
    for name, value in json.loads(os.environ.get(SETTINGS_ENV) or "{}").items():
        if (settings.getpriority(name) or 0) < SETTINGS_PRIORITIES["project"]:
            settings.set(name, value, priority="project")


def patch_crawlers(redis_url: str, workdir: Path,
                   counted: Callable[[], None] = lambda: None) -> Callable[[], None]:
    """Every crawler built from now on gets the add-on (``counted`` is called for each); the
    function returned undoes it."""
    original = Crawler._apply_settings

    def _apply_settings(crawler: Crawler) -> None:
        if not crawler.settings.frozen:
            counted()
            add_settings(crawler, redis_url, workdir)
        original(crawler)

    Crawler._apply_settings = _apply_settings  # type: ignore[method-assign,assignment]

    def restore() -> None:
        Crawler._apply_settings = original  # type: ignore[method-assign]

    return restore


def pass_on(redis_url: str, workdir: Path) -> None:
    """The Pythons this process starts from now on patch their crawlers the same way."""
    os.environ[REDIS_URL_ENV] = redis_url
    os.environ[WORKDIR_ENV] = str(workdir)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(HOOK_DIR) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, str(HOOK_DIR)])


def patch_from_environment() -> None:
    """:func:`patch_crawlers` with what :func:`pass_on` put in the environment, if it did."""
    redis_url, workdir = os.environ.get(REDIS_URL_ENV), os.environ.get(WORKDIR_ENV)
    if redis_url and workdir:
        patch_crawlers(redis_url, Path(workdir))

"""pytest plugin (``-p scrapy_suite.plugin``): every Crawler Scrapy's tests build runs the add-on.

The one place all of them pass through (``get_crawler``, ``CrawlerRunner``, ``AsyncCrawlerRunner``,
``CrawlerProcess``, a bare ``Crawler``) is ``Crawler._apply_settings``, which loads the add-ons
and freezes the settings, before the first component is built. The add-on's settings go in there
at ``command`` priority, below the ``project`` and ``spider`` priorities the tests use for their
own settings, so a test that sets e.g. ``SCHEDULER`` itself still gets its own.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from scrapy.crawler import Crawler
from scrapy.settings import SETTINGS_PRIORITIES

from meteorseed_scrapy.testing.redis_server import RedisServer
from scrapy_suite.reaper import reap_on_exit

ADDON = "meteorseed_scrapy.addon.MeteorSeedAddon"
#: The Redis to use, when the caller started one (``scrapy_suite.run`` does, once for all the
#: pytest processes of a run); else the plugin starts one for its session.
REDIS_URL_ENV = "SCRAPY_SUITE_REDIS_URL"
#: Likewise the directory of the crawlers' SQLite stores (else a temporary one of its own).
WORKDIR_ENV = "SCRAPY_SUITE_WORKDIR"
#: More settings for every crawler, as JSON (``{"ROBOTSTXT_OBEY": false}``), at ``project``
#: priority (above the add-on's) unless the test sets them itself: to tell which of the
#: add-on's settings a failure comes from.
SETTINGS_ENV = "SCRAPY_SUITE_SETTINGS"
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


class SessionRedis:
    """The run's throwaway Redis (appendonly on: without it the add-on warns that a Redis
    restart loses every task, a warning the tests that count warnings would see). A reaper
    ends it, and removes its directory and ``directories``, if its owner dies without
    closing it (pytest-timeout ends a hung pytest with ``os._exit``)."""

    def __init__(self, *directories: str) -> None:
        self.server = RedisServer(appendonly=True).start()
        self.url = self.server.url
        assert self.server.process is not None
        self._reaper = reap_on_exit(self.server.process.pid, self.server.workdir, *directories)

    def close(self) -> None:
        # The reaper first: once the server is stopped its pid may be another process's.
        self._reaper.kill()
        self._reaper.wait()
        if self._reaper.stdin is not None:
            self._reaper.stdin.close()
        # RedisServer keeps the server's stderr pipe open; Scrapy's suite makes the
        # ResourceWarning of an unclosed file an error.
        process = self.server.process
        if process is not None and process.stderr is not None:
            process.stderr.close()
        self.server.close()


class _Injection:
    """The session's Redis and temporary directory, and the settings each crawler gets."""

    def __init__(self) -> None:
        self._own_workdir = not os.environ.get(WORKDIR_ENV)
        self.workdir = Path(os.environ.get(WORKDIR_ENV) or tempfile.mkdtemp(prefix="scrapy-suite-"))
        self.redis: SessionRedis | None = None
        self.redis_url = os.environ.get(REDIS_URL_ENV, "")
        if not self.redis_url:
            self.redis = SessionRedis(*([str(self.workdir)] if self._own_workdir else []))
            self.redis_url = self.redis.url
        self.crawlers = 0
        self._original: Callable[[Crawler], None] = Crawler._apply_settings

    def install(self) -> None:
        original = self._original
        injection = self

        def _apply_settings(crawler: Crawler) -> None:
            if not crawler.settings.frozen:
                injection.add_settings(crawler)
            original(crawler)

        Crawler._apply_settings = _apply_settings  # type: ignore[method-assign,assignment]

    def add_settings(self, crawler: Crawler) -> None:
        self.crawlers += 1
        namespace = f"suite-{uuid.uuid4().hex[:12]}"
        settings = crawler.settings
        settings["ADDONS"][ADDON] = 0
        for name, value in {
            "METEORSEED_REDIS_URL": self.redis_url,
            "METEORSEED_NAMESPACE": namespace,
            "METEORSEED_IDLE_CLOSE": IDLE_CLOSE,
            "METEORSEED_STORE_URI": f"sqlite:///{self.workdir / namespace}.db",
            **POLITENESS,
        }.items():
            settings.set(name, value, priority=PRIORITY)
        for name, value in json.loads(os.environ.get(SETTINGS_ENV) or "{}").items():
            if (settings.getpriority(name) or 0) < SETTINGS_PRIORITIES["project"]:
                settings.set(name, value, priority="project")

    def close(self) -> None:
        Crawler._apply_settings = self._original  # type: ignore[method-assign,assignment]
        if self.redis is not None:
            self.redis.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    injection = _Injection()
    injection.install()
    config.stash[_key] = injection


def pytest_unconfigure(config: pytest.Config) -> None:
    injection = config.stash.get(_key, None)
    if injection is not None:
        injection.close()


def pytest_report_header(config: pytest.Config) -> str:
    injection = config.stash[_key]
    return f"MeteorSeed add-on on every crawler: {ADDON}, Redis at {injection.redis_url}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    injection = terminalreporter.config.stash[_key]
    terminalreporter.write_line(f"MeteorSeed add-on injected into {injection.crawlers} crawlers")


_key = pytest.StashKey[_Injection]()

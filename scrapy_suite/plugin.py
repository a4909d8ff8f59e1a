"""pytest plugin (``-p scrapy_suite.plugin``): every Crawler Scrapy's tests build runs the add-on,
in the pytest process and in every Python it starts (``scrapy_suite.injection``), and no name
lookup leaves the machine (``meteorseed_scrapy.testing.loopback_dns``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from meteorseed_scrapy.testing.loopback_dns import resolve_loopback_only
from meteorseed_scrapy.testing.redis_server import RedisServer
from scrapy_suite.injection import ADDON, REDIS_URL_ENV, WORKDIR_ENV, pass_on, patch_crawlers
from scrapy_suite.reaper import reap_on_exit


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
    """The session's Redis and temporary directory, and the add-on on each crawler."""

    def __init__(self) -> None:
        self._own_workdir = not os.environ.get(WORKDIR_ENV)
        self.workdir = Path(os.environ.get(WORKDIR_ENV) or tempfile.mkdtemp(prefix="scrapy-suite-"))
        self.redis: SessionRedis | None = None
        self.redis_url = os.environ.get(REDIS_URL_ENV, "")
        if not self.redis_url:
            self.redis = SessionRedis(*([str(self.workdir)] if self._own_workdir else []))
            self.redis_url = self.redis.url
        self.crawlers = 0
        self._restore = lambda: None

    def install(self) -> None:
        restore_crawlers = patch_crawlers(self.redis_url, self.workdir, self._count)
        # Scrapy's tests name hosts meant not to exist: their lookups must not leave the machine.
        restore_dns = resolve_loopback_only()

        def restore() -> None:
            restore_crawlers()
            restore_dns()

        self._restore = restore
        pass_on(self.redis_url, self.workdir)

    def _count(self) -> None:
        self.crawlers += 1

    def close(self) -> None:
        self._restore()
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

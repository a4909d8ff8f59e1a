"""Running a :class:`~meteorseed_scrapy.seeding.seeder.Seeder` as a process: what
``scrapy seed-expand --watch`` and ``meteorseed seeder`` share.

Registers a seed file (if given, and again whenever it changes), keeps the site rule configs'
schedule bounds current, stops gracefully on SIGINT/SIGTERM (exit code 0) and waits out a
Redis that is down at start-up instead of failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import REDIS_FAILURES, async_client
from meteorseed_scrapy.seeding.adapt import (
    MAX_INTERVAL_SETTING,
    MIN_INTERVAL_SETTING,
    Bounds,
    site_bounds,
)
from meteorseed_scrapy.seeding.expand_types import Rejection
from meteorseed_scrapy.seeding.fetch import policies
from meteorseed_scrapy.seeding.schedule import parse_interval
from meteorseed_scrapy.seeding.seed_lines import read_lines
from meteorseed_scrapy.seeding.seeder import Seeder, SeederConfig
from meteorseed_scrapy.settings import setting
from meteorseed_scrapy.sites.lookup import SiteConfigs

logger = logging.getLogger(__name__)

#: Seconds between two looks at the seed file and the site rules directory.
RELOAD_INTERVAL = 2.0


def bounds_from(get: Callable[[str], Any]) -> Bounds:
    """The default bounds from ``METEORSEED_SCHEDULE_MIN_INTERVAL`` / ``_MAX_INTERVAL``
    (seconds or durations like ``10m``), read through ``get(name)`` (a settings lookup);
    raises ValueError naming the setting."""
    values = [parse_interval(setting(get, name), name)
              for name in (MIN_INTERVAL_SETTING, MAX_INTERVAL_SETTING)]
    try:
        return Bounds(*values)
    except ValueError:
        raise ValueError(f"{MIN_INTERVAL_SETTING}: must not be above {MAX_INTERVAL_SETTING} "
                         f"({values[0]:g} s > {values[1]:g} s)") from None


def bounds_for(sites: SiteConfigs, defaults: Bounds) -> Callable[[str], Bounds]:
    """``bounds(site_id)``: the site rule config's ``schedule: {min, max}`` over ``defaults``."""

    def bounds(site_id: str) -> Bounds:
        config = sites.get(site_id)
        return site_bounds(config.schedule if config is not None else None, defaults, site_id)

    return bounds


@dataclass
class SeedFile:
    """A seed file registered at start and again whenever it changes (``-``: stdin, once).
    :meth:`read` hands out the lines, :meth:`registered` marks them done: lines whose
    registration a Redis outage cut short are read and registered again."""

    path: str
    stamp: tuple[int, int] | None = None
    checked: float = 0.0
    _pending: tuple[int, int] | None = None
    _stdin_lines: list[bytes] | None = None

    def read(self, stdin: IO[bytes]) -> list[bytes] | None:
        """Its lines when it is new or changed since it was last registered, else None."""
        if self.path == "-":
            if self.stamp is not None:
                return None
            if self._stdin_lines is None:
                self._stdin_lines = list(read_lines(stdin))
            self._pending = (0, 0)
            return self._stdin_lines
        if time.monotonic() - self.checked < RELOAD_INTERVAL and self.stamp is not None:
            return None
        self.checked = time.monotonic()
        info = Path(self.path).stat()
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self.stamp:
            return None
        with open(self.path, "rb") as source:
            lines = list(read_lines(source))
        self._pending = stamp
        return lines

    def registered(self) -> None:
        self.stamp, self._pending = self._pending, None


def log_to(stream: IO[str]) -> None:
    """Send the seeder's log lines (runs, failures, outages) to ``stream`` at INFO; a command
    that runs without Scrapy's logging still shows them."""
    log = logging.getLogger("meteorseed_scrapy.seeding")
    if not any(getattr(h, "stream", None) is stream for h in log.handlers):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)


async def watch(redis_url: str, keys: KeyLayout, *, seed_file: str | None, config: SeederConfig,
                sites: SiteConfigs, bounds: Bounds, say: Callable[[str], None],
                on_error: Callable[[Rejection], None], stdin: IO[bytes] | None = None,
                private_addresses: bool = False) -> int:
    """Run a seeder until SIGINT/SIGTERM; returns the exit code (0 on a graceful stop).
    ``sites``: the site rules (schedule bounds over ``bounds``, allowed domains, blacklist,
    how sitemaps are fetched); ``private_addresses``: METEORSEED_FETCH_PRIVATE_ADDRESSES."""
    client = async_client(redis_url, socket_connect_timeout=10, socket_timeout=60)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    source = SeedFile(seed_file) if seed_file else None
    seeder = Seeder(client, keys, config=config, bounds_for=bounds_for(sites, bounds),
                    rejects=sites.rejects, sitemaps=policies(sites.get, private_addresses),
                    on_wait=lambda backlog: say(
                        f"{backlog} tasks waiting (more than {config.max_backlog}); pausing "
                        "until workers catch up"))

    outages = 0

    async def before_claim() -> None:
        nonlocal outages
        await sites.refresh()
        if source is None:
            return
        if seeder.outages != outages:  # Redis may have come back empty: register again
            outages = seeder.outages
            source.stamp = None
        try:
            lines = source.read(stdin or sys.stdin.buffer)
        except OSError as exc:  # a file being replaced: the previous registration stands
            logger.warning("seeder: cannot read %s: %s", source.path, exc)
            return
        if lines is not None:
            summary = await seeder.register(lines, on_error)
            source.registered()
            say(f"{source.path}: {summary}")

    say(f"watching {keys.namespace} for due seeds (stop with Ctrl-C or SIGTERM)")
    try:
        await seeder.run(stop, before_claim=before_claim)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(*REDIS_FAILURES):
            await client.aclose()
    say(f"stopped after {seeder.runs} seed runs")
    return 0

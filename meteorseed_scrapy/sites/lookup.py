"""Site rule configs by ``site_id``: the one lookup of workers, seeding and the HTTP API.

:class:`SiteConfigs` holds a :class:`~meteorseed_scrapy.sites.loader.SiteRegistry` over
``METEORSEED_SITES_DIR`` (and, when given, the rules pushed to Redis) and reloads it at most
every ``interval`` seconds: on read for a worker's middlewares (:func:`site_configs`, one per
crawler, which prefer the running ``sites`` spider's registry), or in a thread through
:meth:`SiteConfigs.refresh` for asyncio callers. A changed file that does not validate never
replaces the site's last good config. Also the base of the per-site middlewares.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import Request

from meteorseed_scrapy.settings import DEFAULTS, duration_setting, text_setting
from meteorseed_scrapy.sites.loader import SiteRegistry, rules_dir
from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.sites.rulefile import FileResult
from meteorseed_scrapy.task.context import task_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: meta key naming the site of a request that carries no task (the warm-up fetch)
SITE_META_KEY = "meteorseed_site"
#: downloads of robots.txt / the warm-up home page tried before giving up on it
FETCH_ATTEMPTS = 3
#: seconds between two looks at the rules (``METEORSEED_SITES_RELOAD_INTERVAL``'s default)
RELOAD_INTERVAL: float = DEFAULTS["METEORSEED_SITES_RELOAD_INTERVAL"]


class SiteConfigs:
    """Site configs by ``site_id`` from ``directory`` and/or ``remote``, re-read at most every
    ``interval`` seconds (0: read once); with neither, no site has rules. ``reload_on_read``:
    :meth:`get` itself re-reads when due (cheap ``stat`` calls, for the reactor thread);
    else only :meth:`refresh` does, in a thread. ``spider``: returns the running spider,
    whose own registry (the ``sites`` spider's, hot-reloaded there) is used when it has one."""

    def __init__(self, directory: str | Path | None = None, remote: RemoteRules | None = None,
                 *, interval: float = RELOAD_INTERVAL, reload_on_read: bool = False,
                 spider: Callable[[], Any] | None = None) -> None:
        self.directory = rules_dir(directory) if directory else None
        self.interval = interval
        self.reload_on_read = reload_on_read
        self._spider = spider
        self._registry = SiteRegistry(None, remote)  # the directory joins once it is one
        self._polled: float | None = None  # time.monotonic() of the last look
        self._lock = asyncio.Lock()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SiteConfigs:
        settings = crawler.settings
        return cls(text_setting(settings, "METEORSEED_SITES_DIR") or None,
                   interval=duration_setting(settings, "METEORSEED_SITES_RELOAD_INTERVAL"),
                   reload_on_read=True, spider=lambda: getattr(crawler, "spider", None))

    def registry(self) -> SiteRegistry:
        shared = getattr(self._spider(), "registry", None) if self._spider else None
        if isinstance(shared, SiteRegistry):
            return shared
        if self.reload_on_read and self._due():
            with self._looking():
                self._registry.apply(self._poll())
        return self._registry

    def get(self, site_id: str) -> SiteConfig | None:
        return self.registry().get(site_id)

    @property
    def sites(self) -> dict[str, SiteConfig]:
        return self.registry().sites

    async def refresh(self) -> None:
        """Apply changed rules (read in a thread, one look at a time); cheap while not due."""
        if not self._due():
            return
        async with self._lock:
            # (a look counts once applied: a refresh meanwhile waits on the lock rather than
            # going on with the rules of before, none the first time)
            if self._due():
                with self._looking():
                    self._registry.apply(await asyncio.to_thread(self._poll))

    def rejects(self, site_id: str, url: str) -> str | None:
        """Why ``url`` may not be dispatched for ``site_id`` (the site's allowed domains and
        blacklist), or None when it may; a site without rules takes any URL."""
        config = self.get(site_id)
        return None if config is None else config.refusal(url)

    def close(self) -> None:
        self._registry.close()

    def _due(self) -> bool:
        if self.directory is None and self._registry.remote is None:
            return False  # nothing to read, ever
        if self._polled is None:
            return True
        interval = self.interval
        if self.directory is not None and self._registry.directory is None:
            interval = max(interval, 1.0)  # a directory still missing: looked for again
        elif interval <= 0:
            return False
        return time.monotonic() - self._polled >= interval

    @contextmanager
    def _looking(self) -> Iterator[None]:
        """Notes the time of a look at the rules as it ends, applied or failed."""
        try:
            yield
        finally:
            self._polled = time.monotonic()

    def _poll(self) -> list[FileResult]:
        """Blocking: what changed since the last look (the caller notes the look once it has
        applied what changed)."""
        if self.directory is not None and self._registry.directory is None:
            if self.directory.is_dir():
                self._registry.directory = self.directory
            elif self._polled is None:
                logger.warning("METEORSEED_SITES_DIR %r is not a directory: no site rules from"
                               " it until it is one", str(self.directory))
        return self._registry.poll()


_CONFIGS: weakref.WeakKeyDictionary[Any, SiteConfigs] = weakref.WeakKeyDictionary()


def site_configs(crawler: Crawler) -> SiteConfigs:
    """The one :class:`SiteConfigs` of ``crawler`` (shared by the middlewares)."""
    configs = _CONFIGS.get(crawler)
    if configs is None:
        configs = _CONFIGS[crawler] = SiteConfigs.from_crawler(crawler)
    return configs


def site_config(crawler: Crawler, site_id: str) -> SiteConfig | None:
    """The rule config of ``site_id`` as this worker knows it now, or ``None``."""
    return site_configs(crawler).get(site_id)


def site_of(request: Request) -> str | None:
    task = task_of(request)
    if task is not None:
        return task.site_id
    site = request.meta.get(SITE_META_KEY)
    return site if isinstance(site, str) else None


class SiteMiddleware:
    """Base of the middlewares that apply a site's rule config to its requests."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.configs = site_configs(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls(crawler)

    def config_for(self, request: Request) -> tuple[str, SiteConfig] | None:
        site = site_of(request)
        if site is None:
            return None
        config = self.configs.get(site)
        return None if config is None else (site, config)


__all__ = ["FETCH_ATTEMPTS", "SITE_META_KEY", "SiteConfigs", "SiteMiddleware", "site_config",
           "site_configs", "site_of"]

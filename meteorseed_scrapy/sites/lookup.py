"""Site rule configs by ``site_id`` for one crawler, and the base of the per-site middlewares.

The hygiene middlewares (see :mod:`meteorseed_scrapy.middlewares`) share one
:class:`SiteConfigs` per crawler, looked up by the task's ``site_id`` (or, for a request that
carries no task, :data:`SITE_META_KEY`).
"""

from __future__ import annotations

import logging
import time
import weakref
from pathlib import Path
from typing import Any

from scrapy import Request

from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.task.context import task_of

# Logged under the name these middlewares always had (users' logging config refers to it).
logger = logging.getLogger("meteorseed_scrapy.middlewares")

#: meta key naming the site of a request that carries no task (the warm-up fetch)
SITE_META_KEY = "meteorseed_site"
#: downloads of robots.txt / the warm-up home page tried before giving up on it
FETCH_ATTEMPTS = 3


class SiteConfigs:
    """Site configs for one crawler: the running spider's registry when it has one (the
    ``sites`` spider, hot-reloaded there), else one loaded here from ``METEORSEED_SITES_DIR`` and
    re-polled at most every ``METEORSEED_SITES_RELOAD_INTERVAL`` seconds; else none."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self._own: SiteRegistry | None = None
        self._polled = 0.0
        settings = crawler.settings
        self.directory = settings.get("METEORSEED_SITES_DIR") or ""
        self.interval = settings.getfloat("METEORSEED_SITES_RELOAD_INTERVAL", 1.0)

    def registry(self) -> SiteRegistry | None:
        spider = getattr(self.crawler, "spider", None)
        shared = getattr(spider, "registry", None)
        if isinstance(shared, SiteRegistry):
            return shared
        if not self.directory:
            return None
        now = time.monotonic()
        if self._own is None:
            if not Path(self.directory).is_dir():
                if now - self._polled < max(self.interval, 1.0) and self._polled:
                    return None
                if not self._polled:
                    logger.warning("METEORSEED_SITES_DIR %r is not a directory: no site rules",
                                   self.directory)
                self._polled = now  # looked for again (once a second at most)
                return None
            self._own, self._polled = SiteRegistry(self.directory).load(), now
        elif self.interval > 0 and now - self._polled >= self.interval:
            self._polled = now
            self._own.apply(self._own.poll())
        return self._own

    def get(self, site_id: str) -> SiteConfig | None:
        registry = self.registry()
        return registry.get(site_id) if registry is not None else None


_CONFIGS: weakref.WeakKeyDictionary[Any, SiteConfigs] = weakref.WeakKeyDictionary()


def site_configs(crawler: Any) -> SiteConfigs:
    """The one :class:`SiteConfigs` of ``crawler`` (shared by the middlewares)."""
    configs = _CONFIGS.get(crawler)
    if configs is None:
        configs = _CONFIGS[crawler] = SiteConfigs(crawler)
    return configs


def site_config(crawler: Any, site_id: str) -> SiteConfig | None:
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

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.stats = crawler.stats
        self.configs = site_configs(crawler)

    @classmethod
    def from_crawler(cls, crawler: Any) -> Any:
        return cls(crawler)

    def config_for(self, request: Request) -> tuple[str, SiteConfig] | None:
        site = site_of(request)
        if site is None:
            return None
        config = self.configs.get(site)
        return None if config is None else (site, config)


__all__ = ["FETCH_ATTEMPTS", "SITE_META_KEY", "SiteConfigs", "SiteMiddleware", "site_config",
           "site_configs", "site_of"]

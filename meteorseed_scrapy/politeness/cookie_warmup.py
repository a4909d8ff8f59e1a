"""Cookie warm-up: the home page of a ``cookie_warmup`` site is fetched before its first request."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import Request, Spider

from meteorseed_scrapy.sites.lookup import FETCH_ATTEMPTS, SITE_META_KEY, SiteMiddleware

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)


class CookieWarmupMiddleware(SiteMiddleware):
    """Once per site and worker: GET the home page before the first real request goes out.

    The first request waits for the warm-up (concurrent first requests share it); the warm-up is
    not retried when it fails (logged, the real request goes on). Nothing is re-scheduled, so a
    crash mid-warm-up loses nothing: the task is simply redelivered.
    """

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._done: set[str] = set()
        self._pending: dict[str, Any] = {}

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        found = self.config_for(request)
        if found is None or request.meta.get(SITE_META_KEY):
            return
        site, config = found
        if not config.cookie_warmup or site in self._done:
            return
        import asyncio

        future = self._pending.get(site)
        if future is None:
            future = asyncio.ensure_future(self._warm(site, request.url))
            self._pending[site] = future
        await asyncio.shield(future)

    async def _warm(self, site: str, url: str) -> None:
        parts = urlsplit(url)
        home = f"{parts.scheme}://{parts.netloc}/"
        try:
            for attempt in range(1, FETCH_ATTEMPTS + 1):
                warmup = Request(home, dont_filter=True, priority=100,
                                 meta={SITE_META_KEY: site, "handle_httpstatus_all": True})
                try:
                    response = await self.crawler.engine.download_async(warmup)
                except Exception as exc:  # e.g. a dead proxy: the next attempt picks another
                    logger.warning("Cookie warm-up for site %s: GET %s failed (attempt %d): %s",
                                   site, home, attempt, exc)
                    continue
                logger.info("Cookie warm-up for site %s: GET %s -> %s", site, home,
                            response.status)
                if self.stats is not None:
                    self.stats.inc_value(f"meteorseed/warmup/{site}")
                return
            # The real request goes on without the cookies.
        finally:
            self._done.add(site)
            self._pending.pop(site, None)

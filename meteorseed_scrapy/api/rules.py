"""The site rule configs the API checks dispatched URLs against (allowed domains, blacklist).

The rules pushed to Redis (``meteorseed sites push``, :mod:`meteorseed_scrapy.sites.remote`)
and the files of ``--sites-dir`` are read with :class:`~meteorseed_scrapy.sites.loader.
SiteRegistry`, off the event loop and at most once a second, so an edited rule applies to the
next dispatch without a restart. A site without rules has no domain restriction (default
limits), as for ``seed-expand``.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.sites.remote import RemoteRules

RELOAD_INTERVAL_S = 1.0


class SiteRules:
    def __init__(self, directory: str | None, remote: RemoteRules | None = None) -> None:
        self._registry = SiteRegistry(directory or None, remote) \
            if directory or remote is not None else None
        self._next_poll = 0.0
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Apply changed rule files (a thread reads them); cheap when checked recently."""
        if self._registry is None or time.monotonic() < self._next_poll:
            return
        async with self._lock:
            if time.monotonic() < self._next_poll:
                return
            results = await asyncio.to_thread(self._registry.poll)
            self._registry.apply(results)
            self._next_poll = time.monotonic() + RELOAD_INTERVAL_S

    def get(self, site_id: str) -> SiteConfig | None:
        return self._registry.get(site_id) if self._registry is not None else None

    @property
    def sites(self) -> dict[str, SiteConfig]:
        return self._registry.sites if self._registry is not None else {}

    def rejects(self, site_id: str, url: str) -> str | None:
        """Why ``url`` may not be dispatched for ``site_id``, or None when it may."""
        config = self.get(site_id)
        if config is None or config.allows(url):
            return None
        for pattern in config.blacklist:
            if pattern.search(url):
                return f"matches the blacklist pattern {pattern.pattern!r} of site {site_id}"
        host = (urlsplit(url).hostname or "").lower()
        allowed = ", ".join(config.allowed_domains)
        return f"host {host!r} is not in the allowed domains of site {site_id} ({allowed})"

"""Downloader middlewares (the Scrapy-facing faces of politeness).

Now: :class:`SiteSlotMiddleware`, which puts every request of a task into a download slot named
for its site, so Scrapy's local per-slot limits (``CONCURRENT_REQUESTS_PER_DOMAIN``,
``DOWNLOAD_DELAY``, AutoThrottle) apply per site rather than per host name.
The fleet-wide quota, backoff and circuit breaker arrive with the politeness issue.
"""

from __future__ import annotations

from typing import Any

from scrapy import Request, Spider

from meteorseed_scrapy.context import task_of


class SiteSlotMiddleware:
    @classmethod
    def from_crawler(cls, crawler: Any) -> SiteSlotMiddleware:
        return cls()

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        task = task_of(request)
        if task is not None and "download_slot" not in request.meta:
            request.meta["download_slot"] = f"site:{task.site_id}"

"""robots.txt per host, fetched with the headers, User-Agent and proxy of the site needing it."""

from __future__ import annotations

import logging
from typing import Any

from scrapy import Request
from scrapy.downloadermiddlewares.robotstxt import (
    RobotsTxtMiddleware as ScrapyRobotsTxtMiddleware,
)
from scrapy.exceptions import IgnoreRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred

from meteorseed_scrapy.sites.lookup import FETCH_ATTEMPTS, SITE_META_KEY, site_of

# Logged under the name these middlewares always had (users' logging config refers to it).
logger = logging.getLogger(__name__)


class RobotsTxtMiddleware(ScrapyRobotsTxtMiddleware):
    """Scrapy's middleware (one parsed robots.txt per host, kept for the crawl), with two changes:

    * the robots.txt request carries the site of the request that needed it, so it goes out
      with the site's headers, User-Agent and proxy like the site's other requests;
    * under the asyncio reactor, requests that arrive while robots.txt is still downloading all
      await the same Deferred, and turning it into a future consumes its result, so Scrapy lets
      all but the first of them through unchecked. Here each waiter gets its own copy.
    """

    async def robot_parser(self, request: Request) -> Any:
        netloc = urlparse_cached(request).netloc
        pending = self._parsers.get(netloc)
        if isinstance(pending, Deferred):
            waiter: Deferred[Any] = Deferred()

            def forward(result: Any) -> Any:
                waiter.callback(result)
                return result

            pending.addBoth(forward)
            return await maybe_deferred_to_future(waiter)
        if netloc in self._parsers:
            return self._parsers[netloc]
        self._parsers[netloc] = Deferred()
        url = urlparse_cached(request)
        meta: dict[str, Any] = {"dont_obey_robotstxt": True}
        site = site_of(request)
        if site is not None:
            meta[SITE_META_KEY] = site
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            # Retried here: the add-on turns Scrapy's RetryMiddleware off, and a dead proxy of
            # the site should not make the worker ignore its robots.txt.
            robotsreq = Request(f"{url.scheme}://{netloc}/robots.txt", dont_filter=True,
                                priority=self.DOWNLOAD_PRIORITY, meta=dict(meta),
                                callback=NO_CALLBACK)
            try:
                resp = await self.crawler.engine.download_async(robotsreq)
            except Exception as exc:
                if attempt < FETCH_ATTEMPTS and not isinstance(exc, IgnoreRequest):
                    logger.warning("Error downloading %s (attempt %d): %s", robotsreq, attempt,
                                   exc)
                    continue
                if not isinstance(exc, IgnoreRequest):
                    logger.error("Error downloading %(request)s: %(f_exception)s",
                                 {"request": robotsreq, "f_exception": exc})
                self._robots_error(exc, netloc)
            else:
                try:
                    await self._parse_robots(resp, netloc, request)
                except Exception as exc:  # never leave the waiters hanging
                    logger.error("Error parsing %s: %s", robotsreq, exc)
                    self._robots_error(exc, netloc)
            break
        self._stats.inc_value("robotstxt/request_count")
        return self._parsers[netloc]

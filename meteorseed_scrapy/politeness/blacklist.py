"""Per-site blacklist: a URL matching one of the site's ``blacklist`` patterns is never fetched."""

from __future__ import annotations

from scrapy import Request, Spider

from meteorseed_scrapy.sites.lookup import SiteMiddleware
from meteorseed_scrapy.sites.patterns import PatternTimeout
from meteorseed_scrapy.task.exceptions import Blacklisted


class BlacklistMiddleware(SiteMiddleware):
    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        found = self.config_for(request)
        if found is None:
            return
        site, config = found
        if not config.robots:
            request.meta.setdefault("dont_obey_robotstxt", True)
        for pattern in config.blacklist:
            try:
                found_in = pattern.search(request.url)
            except PatternTimeout as exc:  # bounded: the URL is refused, saying why
                found_in = exc
            if found_in:
                if self.stats is not None:
                    self.stats.inc_value(f"meteorseed/blacklisted/{site}")
                raise Blacklisted(site, f"pattern {pattern.pattern!r}"
                                  + (f" ({found_in})" if isinstance(found_in, Exception) else ""))

"""A site's ``headers`` (as defaults) and a User-Agent from its ``user_agents``, round-robin."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import Request, Spider

from meteorseed_scrapy.sites.lookup import SiteMiddleware

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


class UserAgentPoolMiddleware(SiteMiddleware):
    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._turn: dict[str, int] = {}

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        found = self.config_for(request)
        if found is None:
            return
        site, config = found
        for name, value in config.headers.items():
            request.headers.setdefault(name, value)
        agents = config.user_agents
        if agents and b"User-Agent" not in request.headers:
            turn = self._turn.get(site, 0)
            self._turn[site] = turn + 1
            request.headers[b"User-Agent"] = agents[turn % len(agents)]

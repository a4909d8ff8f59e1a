"""A DNS resolver for tests: names under ``public.test`` resolve to a global address, others
as usual. Only for a worker whose downloads all go through a local proxy (``http_proxy``):
the address policy sees a public host, nothing connects to it."""

from __future__ import annotations

from collections.abc import Sequence

from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer

GLOBAL = "93.184.216.34"


class PublicTestNames(CachingThreadedResolver):
    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> defer.Deferred[str]:
        if name == "public.test" or name.endswith(".public.test"):
            return defer.succeed(GLOBAL)
        return super().getHostByName(name, timeout)

"""Worker-side address policy: a task that came through the API is fetched, redirects
included, only from public addresses.

Whoever can call ``/dispatch`` chooses the URLs workers fetch, and what they fetch is stored
(and can be read back): a seed naming ``http://169.254.169.254/`` (cloud metadata),
``http://127.0.0.1:6379/`` or an intranet host, or a public page redirecting there, would turn
the fleet into a proxy into its own network. The API marks the seeds it accepts
(``meta["address_policy"] = "public"``, kept by their tasks and by Scrapy's redirects, which
copy the request's meta), and this middleware refuses such a request when its host is, or
resolves to, a loopback, private, link-local, multicast, reserved or otherwise non-global
address (:func:`~meteorseed_scrapy.seeding.addresses.address_problem`, the sitemap fetcher's
rule). The name is resolved through the reactor's resolver, Scrapy's caching one: the address
checked is the address the download connects to. ``METEORSEED_FETCH_PRIVATE_ADDRESSES`` (the
sitemap fetcher's switch) lets the operator allow them.

Why only API tasks: every test site, and many projects' own targets, are on loopback or an
intranet; the spider's own ``start()`` and ``seed-expand``'s files are the operator's choice,
the API's callers are not. A refused request is ignored (``IgnoreRequest``) with a warning
naming the URL and the address, and ``meteorseed/address_policy/refused``. Such a task, and
the links its page leads to, are fetched over HTTP(S) only: ``file:`` (the worker's own
files), ``data:``, ``ftp:`` and the rest are refused.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached

from meteorseed_scrapy.seeding.addresses import (
    POLICY_META_KEY,
    PRIVATE_SETTING,
    PUBLIC_ONLY,
    address_problem,
    shown_address,
)
from meteorseed_scrapy.settings import flag_setting

logger = logging.getLogger(__name__)
STAT = "meteorseed/address_policy/refused"
WEB_SCHEMES = frozenset({"http", "https"})


Resolve = Callable[[str], Awaitable[str]]


async def reactor_resolve(host: str) -> str:
    """``host``'s address from the reactor's resolver (Scrapy's caching one, which the
    download then uses too)."""
    from twisted.internet import reactor

    address: Any = await maybe_deferred_to_future(
        reactor.resolve(host))  # type: ignore[arg-type]
    return str(address)


class AddressPolicyMiddleware:
    def __init__(self, crawler: Crawler, allow_private: bool,
                 resolve: Resolve = reactor_resolve) -> None:
        self.crawler = crawler
        self.allow_private = allow_private
        self.resolve = resolve

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> AddressPolicyMiddleware:
        return cls(crawler, flag_setting(crawler.settings, PRIVATE_SETTING))

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if request.meta.get(POLICY_META_KEY) != PUBLIC_ONLY:
            return
        url = urlparse_cached(request)
        if url.scheme not in WEB_SCHEMES:  # file:, data:, ftp:... (whatever the switch says)
            self._refuse(request, f"the {url.scheme}: scheme is not fetched (a task from the"
                                  " API fetches over HTTP(S) only)")
        if self.allow_private:
            return
        problem = await self.problem(url.hostname or "")
        if problem is not None:
            self._refuse(request, f"{problem} (a task from the API; set {PRIVATE_SETTING} to"
                                  " allow such addresses)")

    def _refuse(self, request: Request, problem: str) -> NoReturn:
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(STAT)
        reason = f"refused {request.url}: {problem}"
        logger.warning("Address policy: %s", reason)
        raise IgnoreRequest(reason)

    async def problem(self, host: str) -> str | None:
        """Why ``host`` may not be fetched, or None: its address is global."""
        try:
            literal = host.strip("[]")
            ip = ipaddress.ip_address(literal)
            shown = shown_address(literal, ip)
        except ValueError:
            try:
                ip = ipaddress.ip_address(await self.resolve(host))
            except Exception as exc:  # unresolvable: the download would fail the same way
                return f"{host!r} cannot be resolved ({exc})"
            shown = shown_address(host, ip)
        problem = address_problem(ip)
        return None if problem is None else f"{shown} is {problem}"


__all__ = ["STAT", "AddressPolicyMiddleware", "reactor_resolve"]

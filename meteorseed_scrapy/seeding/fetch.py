"""Server-side GETs of URLs that seeds name (sitemaps and their robots.txt), made safe to run
inside the server's network for whoever may dispatch a seed.

* The host is resolved first and each of its addresses checked
  (:func:`~meteorseed_scrapy.seeding.addresses.resolve`: no private addresses unless
  ``METEORSEED_FETCH_PRIVATE_ADDRESSES``). The connection then goes to an address that was
  checked: no second lookup that a rebinding DNS server could answer differently.
* Redirects are followed here, hop by hop, each ``Location`` checked like the first URL:
  http(s) only, the site's allowed domains, its robots.txt, the address check.
* One deadline covers the whole fetch (connecting, every redirect, headers, body): a watchdog
  shuts the socket down when it passes. A per-read timeout alone never fires on a server that
  drips a byte at a time.
* Requests carry the site's headers and User-Agent; its robots.txt is obeyed (Protego).
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urljoin, urlsplit

from protego import Protego

from meteorseed_scrapy.seeding.addresses import AddressError, resolve
from meteorseed_scrapy.seeding.deadline import Deadline
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.task.validation import TaskError, check_url

logger = logging.getLogger(__name__)

#: Seconds one fetch may take in all: connecting, redirects, headers and the whole body.
FETCH_DEADLINE = 120.0
#: Seconds one socket operation may wait (a server that stops sending altogether).
READ_TIMEOUT = 30.0
MAX_REDIRECTS = 5
MAX_ROBOTS_BYTES = DEFAULTS["METEORSEED_ROBOTSTXT_MAXSIZE"]  # the workers' cap (Google's)
DEFAULT_USER_AGENT = "meteorseed-seed-expand"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class FetchError(Exception):
    """A URL that may not be fetched, or a fetch that failed; the message says why."""


@dataclass(frozen=True)
class FetchPolicy:
    """What the server-side fetches for one site may do."""

    private_addresses: bool = False
    site_id: str | None = None
    allowed_domains: tuple[str, ...] = ()  # none: any host
    headers: Mapping[str, str] = field(default_factory=dict)
    user_agent: str = DEFAULT_USER_AGENT
    robots: bool = True
    deadline: float = FETCH_DEADLINE
    timeout: float = READ_TIMEOUT
    #: set: fetches under way stop at once (their expansion was cancelled)
    stop: threading.Event | None = None

    @classmethod
    def for_site(cls, site_id: str, config: SiteConfig | None,
                 private_addresses: bool = False) -> FetchPolicy:
        """The site rule config's domains, headers, first User-Agent and robots switch."""
        if config is None:
            return cls(private_addresses, site_id)
        headers = {k: v for k, v in config.headers.items() if k.lower() != "user-agent"}
        agent = next((v for k, v in config.headers.items() if k.lower() == "user-agent"),
                     config.user_agents[0] if config.user_agents else DEFAULT_USER_AGENT)
        return cls(private_addresses, site_id, tuple(config.allowed_domains), headers, agent,
                   config.robots)

    def domain_problem(self, url: str) -> str | None:
        """Why ``url`` is outside the site's allowed domains, or None."""
        if not self.allowed_domains:
            return None
        try:
            host = (urlsplit(url).hostname or "").lower().rstrip(".")
        except ValueError as exc:  # e.g. "http://[::1"
            return f"is not a valid URL ({exc})"
        if any(host == d or host.endswith("." + d) for d in self.allowed_domains):
            return None
        return (f"host {host!r} is not in the allowed domains of site {self.site_id} "
                f"({', '.join(self.allowed_domains)})")


def policies(sites: Callable[[str], SiteConfig | None], private_addresses: bool = False
             ) -> Callable[[str], FetchPolicy]:
    """``policy(site_id)`` from the site rules ``sites(site_id)`` (read at each call)."""
    return lambda site_id: FetchPolicy.for_site(site_id, sites(site_id), private_addresses)


def _check(watch: Deadline) -> None:
    reason = watch.passed()
    if reason is not None:
        raise FetchError(reason)


_tls: ssl.SSLContext | None = None


def _tls_context() -> ssl.SSLContext:
    global _tls
    if _tls is None:
        _tls = ssl.create_default_context()
    return _tls


class Response:
    """A response being read: :meth:`read` returns what arrived (at most ``n`` bytes, b"" at
    the end) and raises :class:`FetchError` past the deadline or on a cut-off body."""

    def __init__(self, url: str, raw: http.client.HTTPResponse,
                 conn: http.client.HTTPConnection, watch: Deadline) -> None:
        self.url = url
        self.status = raw.status
        self.headers = raw.headers
        self._raw, self._conn, self._watch = raw, conn, watch

    def read(self, n: int) -> bytes:
        try:
            data = self._raw.read1(n)
        except (OSError, http.client.HTTPException) as exc:
            _check(self._watch)  # the deadline, when that is what ended the read
            raise FetchError(_failure(exc, self._watch)) from None
        if not data:
            _check(self._watch)
            if self._raw.length:  # (bytes of Content-Length still missing)
                raise FetchError("the connection closed before the end of the body")
        return data

    def close(self) -> None:
        self._watch.close()
        self._conn.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _failure(exc: BaseException, watch: Deadline) -> str:
    if isinstance(exc, TimeoutError):
        return f"no data for {min(watch.deadline, watch.timeout):g} s"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Fetcher:
    """Fetches under one :class:`FetchPolicy` (one expansion): robots.txt read once per host."""

    def __init__(self, policy: FetchPolicy) -> None:
        self.policy = policy
        self._robots: dict[str, Protego | None] = {}

    def open(self, url: str, *, robots: bool = True) -> Response:
        """GET ``url``, following redirects; the response of the last hop (any status)."""
        watch = Deadline(self.policy.deadline, self.policy.timeout, self.policy.stop)
        try:
            return self._open(url, watch, robots and self.policy.robots)
        except BaseException:
            watch.close()
            raise

    def _open(self, url: str, watch: Deadline, robots: bool) -> Response:
        for _hop in range(MAX_REDIRECTS + 1):
            try:
                check_url(url)
                parts = urlsplit(url)
                host, port = parts.hostname or "", parts.port
            except (TaskError, ValueError) as exc:
                raise FetchError(f"not a fetchable URL: {exc}") from None
            problem = self.policy.domain_problem(url)
            if problem is not None:
                raise FetchError(problem)
            https = parts.scheme.lower() == "https"
            try:
                addresses = resolve(host, port or (443 if https else 80),
                                    self.policy.private_addresses)
            except AddressError as exc:
                raise FetchError(str(exc)) from None
            if robots and not self._allowed(url):
                raise FetchError(f"disallowed by the robots.txt of {parts.netloc}")
            conn = self._connect(host, https, addresses, watch)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            try:
                conn.request("GET", target, headers=self._headers())
                raw = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                _check(watch)
                raise FetchError(_failure(exc, watch)) from None
            if raw.status not in _REDIRECTS:
                return Response(url, raw, conn, watch)
            location = raw.getheader("Location")
            conn.close()
            if not location:
                raise FetchError(f"HTTP {raw.status} without a Location")
            try:
                target_url = urljoin(url, location.strip())
                scheme = urlsplit(target_url).scheme.lower()
            except ValueError as exc:
                raise FetchError(f"redirected to {location[:200]!r}: {exc}") from None
            if scheme not in ("http", "https"):
                raise FetchError(f"redirected to {target_url[:200]!r}: only http and https "
                                 "redirects are followed")
            url = target_url
        raise FetchError(f"more than {MAX_REDIRECTS} redirects")

    def _connect(self, host: str, https: bool, addresses: list[tuple[str, int]],
                 watch: Deadline) -> http.client.HTTPConnection:
        error: OSError | None = None
        for address in addresses:
            _check(watch)
            timeout = max(0.001, min(self.policy.timeout, watch.remaining()))
            try:
                sock = socket.create_connection(address, timeout)  # the checked address
            except OSError as exc:
                error = exc
                continue
            watch.track(sock)
            try:
                if https:
                    sock = _tls_context().wrap_socket(sock, server_hostname=host)
                    watch.track(sock)
            except OSError as exc:
                sock.close()
                _check(watch)
                raise FetchError(_failure(exc, watch)) from None
            conn: http.client.HTTPConnection = (
                http.client.HTTPSConnection(host, address[1], timeout=timeout) if https
                else http.client.HTTPConnection(host, address[1], timeout=timeout))
            conn.sock = sock  # connected here, so http.client never connects by itself
            return conn
        _check(watch)
        raise FetchError(f"cannot connect to {host} ({_failure(error, watch) if error else '?'})")

    def _headers(self) -> dict[str, str]:
        return {**self.policy.headers, "User-Agent": self.policy.user_agent}

    def _allowed(self, url: str) -> bool:
        parts = urlsplit(url)
        origin = f"{parts.scheme.lower()}://{parts.netloc.lower()}"
        if origin not in self._robots:
            self._robots[origin] = self._read_robots(origin + "/robots.txt")
        parser = self._robots[origin]
        return parser is None or bool(parser.can_fetch(url, self.policy.user_agent))

    def _read_robots(self, url: str) -> Protego | None:
        """The parsed robots.txt, or None (fetch as if it allowed everything) when there is
        none or it cannot be read, as Scrapy's RobotsTxtMiddleware does."""
        try:
            with self.open(url, robots=False) as response:
                if not 200 <= response.status < 300:
                    return None
                body = read_all(response, MAX_ROBOTS_BYTES)
        except FetchError as exc:
            if self.policy.stop is not None and self.policy.stop.is_set():
                raise
            logger.info("Cannot read %s (%s): fetching as if it allowed everything", url, exc)
            return None
        return Protego.parse(body.decode("utf-8", "replace"))


def read_all(response: Response, limit: int) -> bytes:
    """The body, at most ``limit`` bytes (the rest is not read)."""
    parts: list[bytes] = []
    size = 0
    while size < limit and (chunk := response.read(min(64 * 1024, limit - size))):
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


__all__ = ["DEFAULT_USER_AGENT", "FETCH_DEADLINE", "MAX_REDIRECTS", "READ_TIMEOUT",
           "FetchError", "FetchPolicy", "Fetcher", "Response", "policies", "read_all"]

"""What keeps ``meteorseed serve`` answering under attack.

- **Connections.** At most ``max_connections`` are open. A new one beyond that takes the
  place of the oldest connection waiting for a request (idle keep-alive, or headers trickling
  in); when every open connection is busy with a request, the new one is answered 503 with
  ``Retry-After`` and closed. Idle connections without a token thus never starve authorised
  clients of file descriptors.
- **Timeouts.** A connection waiting for a complete request head (a fresh connection, an idle
  keep-alive, a client sending its headers a byte at a time) is closed after ``idle_timeout``,
  which data received does not push back: aiohttp's keep-alive deadline, and the site's own for
  a connection's first request (aiohttp sets none before it until 3.14.4); a request body not
  received within ``body_timeout`` is answered 408.
- **Without a token** (``--insecure-no-auth``) only loopback clients of loopback names are
  served: the ``Host`` must be a loopback name or address (a DNS-rebinding page names its own
  domain), an ``Origin``, when sent, too (a cross-site page's request carries its origin), and
  a state-changing request may not use the content types a browser sends cross-site without a
  preflight (``text/plain``, forms): a CSRF cannot enqueue a seed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from urllib.parse import urlsplit

from aiohttp import web

from meteorseed_scrapy.api import aiohttp_internals
from meteorseed_scrapy.api.config import CONFIG
from meteorseed_scrapy.api.problems import Handler, problem
from meteorseed_scrapy.seeding.addresses import plain_address

logger = logging.getLogger(__name__)

#: Methods that change state: refused with a simple-request content type when there is no token.
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: What a browser sends cross-site without asking first (a CORS "simple request").
SIMPLE_CONTENT_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded",
                                  "multipart/form-data"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})
_BUSY_TEXT = b"too many connections, retry later\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
         b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY_TEXT),
                                                                       _BUSY_TEXT))
#: Connections waiting to be accepted (aiohttp's ``TCPSite`` default).
_BACKLOG = 128


def runner(app: web.Application) -> web.AppRunner:
    """The app's runner, with the idle/header timeout of its config (aiohttp's default keeps
    a connection that never sends a request for an hour)."""
    config = app[CONFIG]
    return web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=10.0,
                         keepalive_timeout=config.idle_timeout)


def site(runner: web.AppRunner, host: str, port: int) -> GuardedSite:
    """The guarded site of ``runner``'s app, with the limits of its config."""
    config = runner.app[CONFIG]
    return GuardedSite(runner, host, port, max_connections=config.max_connections,
                       head_timeout=config.idle_timeout)


class GuardedSite(web.BaseSite):
    """A TCP site holding at most ``max_connections`` connections open, each of which has
    ``head_timeout`` seconds for its first request head (see the module).

    Built on aiohttp's public site base, not ``TCPSite``, whose ``start`` hands aiohttp's
    server to asyncio as is: the cap needs a protocol factory of its own. (So the runner's
    ``addresses`` do not list it: :attr:`port` is the port bound.)"""

    __slots__ = ("_app_runner", "_head_timeout", "_host", "_listener", "_max_connections",
                 "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 max_connections: int, head_timeout: float) -> None:
        super().__init__(runner)
        self._app_runner = runner
        self._host = host
        self._port = port
        self._max_connections = max_connections
        self._head_timeout = head_timeout
        self._listener: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The port listened on once started (0 asks for a free one)."""
        sockets = self._listener.sockets if self._listener is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        await super().start()  # registers the site with its runner, which stops it
        server = self._app_runner.server
        assert server is not None
        aiohttp_internals.check(server())
        cap, head_timeout = self._max_connections, self._head_timeout
        loop = asyncio.get_running_loop()
        # Counted here, not from server.connections: asyncio makes every protocol of a burst
        # of accepts before it tells the first one it is connected.
        handlers: list[web.RequestHandler] = []
        # Each open connection's first-request deadline, cancelled once it is gone: a flood
        # of connections closed at once would else keep every handler for head_timeout.
        deadlines: dict[web.RequestHandler, asyncio.TimerHandle] = {}

        def protocol() -> asyncio.Protocol:
            open_now = []
            for handler in handlers:
                if not aiohttp_internals.connection_lost(handler):
                    open_now.append(handler)
                elif (deadline := deadlines.pop(handler, None)) is not None:  # (else passed)
                    deadline.cancel()
            handlers[:] = open_now
            if len(handlers) >= cap and not _evict_idle(handlers):
                return _Busy()
            handler = server()
            handlers.append(handler)
            deadlines[handler] = loop.call_later(head_timeout, _close_without_request, handler,
                                                 deadlines)
            return handler

        self._listener = await loop.create_server(protocol, self._host, self._port,
                                                  backlog=_BACKLOG)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        await super().stop()


def _close_without_request(handler: web.RequestHandler,
                           deadlines: dict[web.RequestHandler, asyncio.TimerHandle]) -> None:
    """Close ``handler``'s connection if no complete request head came on it."""
    deadlines.pop(handler, None)
    if not aiohttp_internals.connection_lost(handler) \
            and aiohttp_internals.requests_received(handler) == 0:
        handler.force_close()


def _evict_idle(connections: list[web.RequestHandler]) -> bool:
    """Close the oldest connection waiting for a request; whether there was one."""
    for handler in connections:  # in the order they connected
        if aiohttp_internals.awaits_request(handler):
            handler.force_close()
            return True
    return False


class _Busy(asyncio.Protocol):
    """Answers 503 and closes: every connection the cap allows is busy with a request."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_BUSY)
        transport.close()


@web.middleware
async def body_timeout_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The body, read here within ``body_timeout`` (aiohttp keeps it for the handler)."""
    if request.can_read_body:
        timeout = request.app[CONFIG].body_timeout
        try:
            await asyncio.wait_for(request.read(), timeout)
        except asyncio.TimeoutError:
            return problem(408, f"the request body did not arrive within {timeout:g} s",
                           headers={"Connection": "close"})
        except ConnectionResetError:  # the client left: nobody reads an answer, no traceback
            return problem(400, "the connection was lost while the body was read")
    return await handler(request)


@web.middleware
async def local_only_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Without a token: loopback names, loopback origins, no simple-request content types on
    state-changing routes (see the module)."""
    if request.app[CONFIG].token is not None:
        return await handler(request)
    host = request.headers.get("Host", "")
    if not is_loopback_host(host):
        return problem(403, f"Host {host[:100]!r} is not a loopback name: without a token"
                            " (--insecure-no-auth) only localhost is served")
    origin = request.headers.get("Origin")
    if origin is not None and not is_loopback_origin(origin):
        return problem(403, f"Origin {origin[:100]!r} is not a loopback origin: without a"
                            " token (--insecure-no-auth) cross-site requests are refused")
    if request.method in STATE_CHANGING and request.content_type in SIMPLE_CONTENT_TYPES:
        return problem(415, f"{request.method} with Content-Type {request.content_type}:"
                            " without a token (--insecure-no-auth) send application/json")
    return await handler(request)


def is_loopback_host(value: str) -> bool:
    """Whether a ``Host`` header (``name[:port]``, ``[v6][:port]``) names loopback."""
    try:
        parts = urlsplit(f"//{value}")
        host, _ = parts.hostname, parts.port  # (.port refuses a port that is no number)
    except ValueError:
        return False
    if parts.username is not None or parts.password is not None:
        return False
    if not host:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return plain_address(ipaddress.ip_address(host)).is_loopback
    except ValueError:
        return False


def is_loopback_origin(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and is_loopback_host(parts.netloc)


__all__ = ["GuardedSite", "body_timeout_middleware", "is_loopback_host", "is_loopback_origin",
           "local_only_middleware", "runner", "site"]

"""``meteorseed serve`` under attack, over real sockets: idle connections without a token
cannot exhaust its file descriptors (a cap; the oldest connection waiting for a request makes
room), a connection that never completes its request head is closed, a body that never arrives
is answered 408; without a token (``--insecure-no-auth``) only loopback names and origins are
served and a cross-site simple request cannot change state (CSRF, DNS rebinding)."""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import socket
import time
from contextlib import ExitStack
from typing import Any

import pytest
from aiohttp import web

from meteorseed_scrapy.api import guard
from meteorseed_scrapy.api.background import ServerThread
from meteorseed_scrapy.api.config import ApiConfig
from meteorseed_scrapy.api.guard import is_loopback_host, is_loopback_origin
from meteorseed_scrapy.testing.polling import wait_for
from tests.api_helpers import TOKEN, ApiServer

SEED = {"seeds": [{"seed_id": "a", "site_id": "shop", "task_type": "url_list",
                   "payload": {"urls": ["https://shop.example/"]}}]}


def request(server: ServerThread, method: str, path: str, *, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        text = response.read()
        if "json" in response.getheader("Content-Type", ""):
            return response.status, json.loads(text)
        return response.status, text
    finally:
        connection.close()


def authorised(server: ServerThread, method: str = "GET", path: str = "/seeds") -> int:
    return request(server, method, path, headers={"Authorization": f"Bearer {TOKEN}"})[0]


def idle_connection(server: ServerThread) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=30)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (after a 503, or without a word)."""
    sock.settimeout(0)
    try:
        while sock.recv(4096):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_idle_connections_beyond_the_cap_make_room_for_an_authorised_client(
        api_server: ApiServer) -> None:
    """The reported case scaled down: 1,100 idle sockets against a cap of 256 is 50 against 20."""
    with api_server(max_connections=20, idle_timeout=60) as server, \
            ExitStack() as stack:
        sockets = [stack.enter_context(idle_connection(server)) for _ in range(50)]
        # each one past the cap closed the oldest idle one: at most 20 stay open
        wait_for(lambda: sum(not closed_by_server(s) for s in sockets) <= 20, timeout=30)
        assert authorised(server) == 200  # served at once, not after the idle timeout
        assert sum(closed_by_server(s) for s in sockets) >= 31  # its room came from one more


def test_a_new_connection_is_answered_503_when_every_one_is_busy(api_server: ApiServer) -> None:
    with api_server(max_connections=3, body_timeout=60) as server, \
            ExitStack() as stack:
        busy = []
        for _ in range(3):  # requests whose body never comes: busy, not idle
            sock = stack.enter_context(idle_connection(server))
            sock.sendall(b"POST /dispatch HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                         + TOKEN.encode() + b"\r\nContent-Type: application/json\r\n"
                         b"Expect: 100-continue\r\nContent-Length: 100\r\n\r\n")
            # its handler runs (and waits for the body) once the server says to go on
            assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue")
            sock.sendall(b"{")
            busy.append(sock)
        status, text = request(server, "GET", "/openapi.json")
        assert (status, text) == (503, b"too many connections, retry later\n")
        assert not any(closed_by_server(sock) for sock in busy)  # none was taken for idle


def test_a_connection_that_never_sends_a_request_is_closed(api_server: ApiServer) -> None:
    with api_server(idle_timeout=0.5) as server, \
            idle_connection(server) as sock:
        sock.settimeout(30)
        assert sock.recv(1) == b""  # closed by the server, long before aiohttp's hour


def test_headers_sent_a_byte_at_a_time_do_not_keep_a_connection(api_server: ApiServer) -> None:
    """Slowloris: every byte received does not push the deadline back."""
    with api_server(idle_timeout=0.5) as server, \
            idle_connection(server) as sock:
        sock.sendall(b"GET /seeds HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        for _ in range(600):  # up to 60 s of trickling: the server closes long before
            try:
                sock.sendall(b"X")
            except OSError:
                closed = True
                break
            if closed_by_server(sock):
                closed = True
                break
            time.sleep(0.1)
        assert closed


def test_connections_closed_at_once_are_not_kept_until_their_deadline(
        api_server: ApiServer) -> None:
    """A flood of connections opened and closed at once: each one's first-request deadline
    used to hold its handler for idle_timeout (2 KB each: 5,000 a second kept 100 MB)."""
    def live_handlers() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, web.RequestHandler))

    with api_server(idle_timeout=600) as server:
        before = live_handlers()
        for _ in range(300):
            socket.create_connection((server.host, server.port), timeout=30).close()
        # (a connection's handler is let go when the next one comes: one request each try)
        wait_for(lambda: authorised(server) == 200 and live_handlers() <= before + 2,
                 timeout=30)


def test_a_body_that_never_arrives_is_answered_408(api_server: ApiServer) -> None:
    with api_server(body_timeout=0.5) as server, \
            idle_connection(server) as sock:
        sock.sendall(b"POST /dispatch HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                     + TOKEN.encode() + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"seeds\": ")
        sock.settimeout(30)
        answer = b""
        while b"did not arrive" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b"did not arrive within 0.5 s" in answer


def test_the_sites_first_request_deadline_closes_only_a_connection_without_one() -> None:
    """The site's own deadline (aiohttp's, set here to an hour, starts only after a response
    before aiohttp 3.14.4): a connection that never sent a request is closed at it; one that
    did is aiohttp's keep-alive business and keeps serving."""
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        return await reader.readexactly(2)

    async def run() -> None:
        app = web.Application()
        app.router.add_get("/", ok)
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=3600)
        await runner.setup()
        try:
            site = guard.GuardedSite(runner, "127.0.0.1", 0, max_connections=10,
                                     head_timeout=0.2)
            await site.start()
            served = await asyncio.open_connection("127.0.0.1", site.port)
            assert await get(*served) == b"ok"
            silent, _ = await asyncio.open_connection("127.0.0.1", site.port)
            # closed at its deadline, which comes after the served connection's
            assert await asyncio.wait_for(silent.read(), 30) == b""
            assert await asyncio.wait_for(get(*served), 30) == b"ok"
        finally:
            await runner.cleanup()

    asyncio.run(run())


@pytest.mark.parametrize("limit", [{"max_connections": 0}, {"idle_timeout": 0},
                                   {"body_timeout": float("nan")}, {"idle_timeout": -1}])
def test_limits_that_cannot_work_are_refused_naming_the_field(limit: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(limit))):
        ApiConfig(redis_url="redis://127.0.0.1:1/0", **limit)


# -- without a token ---------------------------------------------------------------------------

def test_without_a_token_a_foreign_host_is_refused(api_server: ApiServer) -> None:
    """DNS rebinding: the attacker's name resolves to 127.0.0.1, the Host header keeps it."""
    with api_server(token=None) as server:
        status, body = request(server, "GET", "/seeds", headers={"Host": "evil.example:8080"})
        assert status == 403
        assert "Host 'evil.example:8080' is not a loopback name" in body["detail"]
        for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "[::1]"):
            assert request(server, "GET", "/seeds", headers={"Host": host})[0] == 200


def test_without_a_token_a_cross_site_post_enqueues_nothing(api_server: ApiServer) -> None:
    with api_server(token=None) as server:
        body = json.dumps(SEED).encode()
        # a page elsewhere posting JSON as text/plain: no preflight, its Origin sent
        status, problem = request(server, "POST", "/dispatch", body=body, headers={
            "Content-Type": "text/plain", "Origin": "http://evil.example"})
        assert status == 403 and "Origin 'http://evil.example'" in problem["detail"]
        for simple in ("text/plain", "application/x-www-form-urlencoded",
                       "multipart/form-data; boundary=x"):
            status, problem = request(server, "POST", "/dispatch", body=body,
                                      headers={"Content-Type": simple})
            assert status == 415, simple
            assert "send application/json" in problem["detail"]
        assert request(server, "GET", "/seeds")[1]["seeds"] == []  # nothing was enqueued
        status, _ = request(server, "POST", "/dispatch", body=body, headers={
            "Content-Type": "application/json", "Origin": f"http://127.0.0.1:{server.port}"})
        assert status in (200, 201, 202)
        assert [s["seed_id"] for s in request(server, "GET", "/seeds")[1]["seeds"]] == ["a"]


def test_with_a_token_the_host_and_origin_are_the_tokens_business(api_server: ApiServer) -> None:
    with api_server() as server:
        status, _ = request(server, "GET", "/seeds", headers={
            "Host": "api.example", "Origin": "https://console.example",
            "Authorization": f"Bearer {TOKEN}"})
        assert status == 200


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("LOCALHOST:80", True), ("127.0.0.1", True), ("127.8.9.1:1", True),
    ("[::1]:8080", True), ("[::1]", True), ("", False), ("evil.example", False),
    ("localhost.evil.example", False), ("127.0.0.1.nip.io", False), ("10.0.0.1", False),
    # an IPv4-mapped loopback is loopback on every Python (3.13's reading)
    ("0.0.0.0", False), ("[::ffff:127.0.0.1]", True), ("127.0.0.1@evil.example", False),
    ("localhost:notaport", False), ("[::1", False)])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


@pytest.mark.parametrize(("origin", "loopback"), [
    ("http://localhost:8080", True), ("https://127.0.0.1", True), ("null", False),
    ("file://", False), ("http://evil.example", False), ("ftp://localhost", False)])
def test_loopback_origins(origin: str, loopback: bool) -> None:
    assert is_loopback_origin(origin) is loopback

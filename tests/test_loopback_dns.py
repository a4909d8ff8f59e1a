"""The tests' guard on name lookups (meteorseed_scrapy.testing.loopback_dns): loopback names and
IP literals resolve, any other name fails as an unknown one, in every way Python and Twisted
look names up, and nothing is left patched once it is off."""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import subprocess
import sys
from unittest import mock

import pytest
from twisted.internet._resolver import GAIResolver

from meteorseed_scrapy.testing.loopback_dns import resolvable_here, resolve_loopback_only
from tests.subprocess_env import OFFLINE_PYTHON, python_path

MISSING = "thereisdefinetelynosuchdomain.com"


@pytest.mark.parametrize("host", [
    None, "", "localhost", "LOCALHOST.", "ip6-localhost", "app.localhost", "127.0.0.1",
    "127.8.9.10", "::1", "10.200.1.2", "fe80::1%eth0", b"localhost", b"127.0.0.1",
    "127.1", "2130706433", "0x7f000001", "1.2.3",  # (inet_aton's forms: no query either)
    "\uff11\uff12\uff17.0.0.1",  # (fullwidth digits, encoded as socket does: 127.0.0.1)
])
def test_names_that_need_no_query_off_the_machine_resolve(host: str | bytes | None) -> None:
    assert resolvable_here(host)


@pytest.mark.parametrize("host", [
    MISSING, "non-existing-host", "example.com", "localhost.example.com", "localhostx",
    "127.0.0.1.nip.io", "xn--i-7iq.ws", "foo_bar.example", b"example.com", "127.0.0.1 x",
    "0x7g000001",
])
def test_any_other_name_would_need_a_query(host: str | bytes) -> None:
    assert not resolvable_here(host)


def test_every_lookup_refuses_other_names_as_unknown_and_answers_loopback_ones() -> None:
    # (the suite's conftest has the guard on already: a second one must not stack)
    restore = resolve_loopback_only()
    try:
        for lookup in (lambda: socket.getaddrinfo(MISSING, 80),
                       lambda: socket.gethostbyname(MISSING),
                       lambda: socket.gethostbyname_ex(MISSING)):
            # (the message tells the guard's refusal from a real lookup's answer)
            with pytest.raises(socket.gaierror, match="loopback names only") as caught:
                lookup()
            assert caught.value.errno == socket.EAI_NONAME
        assert socket.gethostbyname("localhost").startswith("127.")
        assert {info[4][0] for info in socket.getaddrinfo("127.0.0.1", 80)} == {"127.0.0.1"}

        async def through_asyncio() -> None:
            with pytest.raises(socket.gaierror, match="loopback names only"):
                await asyncio.get_running_loop().getaddrinfo(MISSING, 80)

        asyncio.run(through_asyncio())
        # Twisted's resolver holds socket.getaddrinfo from import time: the guard is below it.
        held = inspect.signature(GAIResolver.__init__).parameters["getaddrinfo"].default
        with pytest.raises(socket.gaierror, match="loopback names only"):
            held(MISSING, 80)
    finally:
        restore()


def test_reverse_lookups_answer_loopback_addresses_only() -> None:
    restore = resolve_loopback_only()
    try:
        assert socket.gethostbyaddr("127.0.0.1")[2] == ["127.0.0.1"]
        # (HTTPServer names itself so: a namespace's address, tests/test_fleet_*, is no query)
        assert socket.getfqdn("10.213.7.3") == "10.213.7.3"
        with pytest.raises(socket.herror, match="loopback names only"):
            socket.gethostbyaddr("10.213.7.3")
        with pytest.raises(socket.gaierror, match="loopback names only"):
            socket.getnameinfo(("10.213.7.3", 80), 0)
        assert socket.getnameinfo(("10.213.7.3", 80), socket.NI_NUMERICHOST
                                  | socket.NI_NUMERICSERV) == ("10.213.7.3", "80")
        assert socket.getnameinfo(("127.0.0.1", 80), socket.NI_NUMERICSERV)[1] == "80"
    finally:
        restore()


def test_a_loopback_site_on_another_address_names_itself_without_a_lookup() -> None:
    from meteorseed_scrapy.testing.loopback import LoopbackHandler, LoopbackHTTPServer

    # (on a namespace's address, HTTPServer's own socket.getfqdn would be a query: none here)
    with mock.patch.object(socket, "getfqdn", side_effect=AssertionError("a lookup")), \
            LoopbackHTTPServer(("127.0.0.2", 0), LoopbackHandler) as server:
        assert (server.server_name, server.server_port) == ("127.0.0.2", server.server_address[1])


def test_off_restores_what_was_there() -> None:
    names = ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo")
    before = [getattr(socket, name) for name in names]
    restore = resolve_loopback_only()
    restore()
    assert [getattr(socket, name) for name in names] == before


LOOKUPS = """
import socket
for host in ("localhost", "127.0.0.1"):
    socket.getaddrinfo(host, 80)
try:
    socket.getaddrinfo("example.com", 80)
except socket.gaierror as error:
    print(error)
"""


@pytest.mark.parametrize("pythonpath", [None, "own"], ids=["inherited", "own"])
def test_a_python_subprocess_resolves_loopback_names_only_too(pythonpath: str | None) -> None:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = python_path("/nonexistent")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(OFFLINE_PYTHON)
    out = subprocess.run([sys.executable, "-c", LOOKUPS], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    assert "loopback names only" in out.stdout and out.stderr == ""


def test_the_subprocess_path_names_the_guard_first_and_each_directory_once() -> None:
    joined = python_path("/a", f"/b{os.pathsep}/a", "", OFFLINE_PYTHON)
    assert joined.split(os.pathsep) == [str(OFFLINE_PYTHON), "/a", "/b"]

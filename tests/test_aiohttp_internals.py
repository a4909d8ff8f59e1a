"""aiohttp_internals: every private part of aiohttp the API server uses is there on the installed
aiohttp (this test fails, naming it, on one that lacks it; so does ``meteorseed serve``), the
installed aiohttp is within the checked range, and nothing else in the package reaches into
aiohttp's privates."""

from __future__ import annotations

import ast
import asyncio
import re
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from packaging.version import Version

from meteorseed_scrapy.api import aiohttp_internals, guard
from meteorseed_scrapy.api.aiohttp_internals import AIOHTTP_CHECKED_ON, check, missing
from tests import internals_helpers
from tests.api_helpers import ApiServer
from tests.internals_helpers import assert_in_checked_range, setup_cfg_floor

PACKAGE = Path(aiohttp_internals.__file__).parent.parent


def _handler() -> web.RequestHandler:
    """A fresh request handler of the installed aiohttp, as its server makes one per connection."""
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response()

    async def build() -> web.RequestHandler:
        return web.Server(handle)()

    return asyncio.run(build())


def test_every_private_part_used_is_in_the_installed_aiohttp() -> None:
    handler = _handler()
    assert missing(handler) == [], (
        f"aiohttp {aiohttp.__version__} lacks private parts meteorseed serve uses: see "
        "meteorseed_scrapy/api/aiohttp_internals.py")
    check(handler)
    # a fresh handler: connected to nothing yet, no request, not waiting for one yet
    assert not aiohttp_internals.connection_lost(handler)
    assert aiohttp_internals.requests_received(handler) == 0
    assert not aiohttp_internals.awaits_request(handler)


def test_the_installed_release_is_in_the_checked_range() -> None:
    assert_in_checked_range("aiohttp", AIOHTTP_CHECKED_ON, "aiohttp_internals.py")


def test_the_checked_floor_is_setup_cfgs() -> None:
    assert setup_cfg_floor("aiohttp") == Version(AIOHTTP_CHECKED_ON[0])


def test_an_aiohttp_lacking_a_part_fails_loudly() -> None:
    handler = _handler()
    del handler._waiter  # (a slot: gone from this instance)
    assert missing(handler) == ["RequestHandler._waiter"]
    with pytest.raises(RuntimeError, match=r"needs RequestHandler\._waiter of aiohttp \(checked "
                       r"on aiohttp 3\.10\.5 to [\d.]+\); aiohttp [\d.]+ lacks it"):
        check(handler)


def test_the_server_does_not_start_on_an_aiohttp_lacking_a_part(
        api_server: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiohttp_internals, "_HANDLER_ATTRIBUTES",
                        ("_manager", "_gone", "_also_gone"))
    with pytest.raises(RuntimeError, match=r"did not start: meteorseed serve needs "
                       r"RequestHandler\._gone, RequestHandler\._also_gone of aiohttp .* lacks "
                       r"them"), api_server():
        pass


def test_the_site_names_its_port_and_closes_it_when_stopped(api_server: ApiServer) -> None:
    with api_server() as server:
        assert server.port != 0
        socket.create_connection((server.host, server.port), timeout=30).close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((server.host, server.port), timeout=30)


def test_a_sites_name_is_its_url() -> None:
    async def names() -> list[str]:
        runner = web.AppRunner(web.Application())
        await runner.setup()
        try:
            return [guard.GuardedSite(runner, host, 8080, max_connections=1,
                                      head_timeout=1.0).name for host in ("127.0.0.1", "::1")]
        finally:
            await runner.cleanup()

    assert asyncio.run(names()) == ["http://127.0.0.1:8080", "http://[::1]:8080"]


# -- nobody else touches aiohttp's privates ------------------------------------------------------
#: Private modules of aiohttp, and private attributes of the aiohttp objects the package handles.
PRIVATE = re.compile(r"\bfrom aiohttp\.(?!(abc|web)\b)\w+ import|"
                     r"\b(aiohttp|web)(\.\w+)*\._[a-z]\w*|"
                     r"\b_?(handlers?|h|site|runner|server|request|response|transport|protocol|"
                     r"session|connector|app)(\[\w*\])?\._[a-z]\w*|"
                     r"getattr\(\w+,\s*[\"']_[a-z]")


def _aiohttp_base_private(name: str, cls: type) -> bool:
    """Whether ``name`` is an attribute of an aiohttp class in ``cls``'s bases."""
    for base in cls.__mro__:
        if not base.__module__.startswith("aiohttp"):
            continue
        init = vars(base).get("__init__")
        assigned = getattr(getattr(init, "__code__", None), "co_names", ())
        if name in vars(base) or name in assigned:
            return True
    return False


def _subclass_offenders(tree: ast.Module, names: dict[str, object]) -> list[int]:
    """Lines of ``self._x`` in a class deriving from aiohttp's where ``_x`` is aiohttp's."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [names.get(ast.unparse(b).split(".")[0]) for b in node.bases]
        classes = []
        for base, expr in zip(bases, node.bases, strict=True):
            for part in ast.unparse(expr).split(".")[1:]:
                base = getattr(base, part, None)
            if isinstance(base, type):
                classes.append(base)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                    and sub.value.id == "self" and sub.attr.startswith("_") \
                    and not sub.attr.startswith("__") \
                    and any(_aiohttp_base_private(sub.attr, c) for c in classes):
                found.append(sub.lineno)
    return found


def offenders(package: Path) -> list[str]:
    names: dict[str, object] = {"web": web, "aiohttp": aiohttp}
    return internals_helpers.offenders(
        package, PRIVATE, "aiohttp_internals.py", mentioning="aiohttp",
        more=lambda text: _subclass_offenders(ast.parse(text), names))


def test_no_other_module_touches_aiohttps_privates() -> None:
    assert offenders(PACKAGE) == []


def test_the_offenders_scan_sees_the_old_guarded_sites_privates(tmp_path: Path) -> None:
    assert internals_helpers.flagged(offenders, tmp_path, (
        "from aiohttp import web\n"
        "from aiohttp.web_protocol import RequestHandler\n"
        "class Site(web.TCPSite):\n"
        "    __slots__ = ('_cap',)\n"
        "    async def start(self) -> None:\n"
        "        self._cap = 1  # (a name of its own)\n"
        "        server = self._runner.server\n"
        "        self._bound_port = self._port\n"
        "alive = [h for h in handlers if getattr(h, '_manager', None) is not None]\n"
        "waiting = handler._waiter  # a comment's handler._waiter is no touch\n")) == [
        2, 7, 8, 9, 10]

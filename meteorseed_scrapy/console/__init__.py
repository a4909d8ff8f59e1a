"""The web console: a dependency-free single page served next to the dispatch API.

``/console/`` is plain HTML, CSS and JavaScript (package data in ``console/static``). The page
itself holds no data and is public; it asks for the API token once (kept in sessionStorage)
and fetches the JSON routes of the same server with it. A strict Content-Security-Policy
(same-origin scripts only, no inline script) backs up the page's own escaping.
"""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).parent / "static"
_ASSET = re.compile(r"^[a-z][a-z0-9_-]*\.(html|js|css)$")
_TYPES = {"html": "text/html", "js": "text/javascript", "css": "text/css"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


async def root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/console/")


async def index(request: web.Request) -> web.StreamResponse:
    return _file("index.html")


async def asset(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if not _ASSET.match(name):
        raise web.HTTPNotFound(text=f"no console file {name!r}")
    return _file(name)


def _file(name: str) -> web.Response:
    path = STATIC / name
    try:
        body = path.read_bytes()  # a few KB, read per request: edits show without restart
    except OSError:
        raise web.HTTPNotFound(text=f"no console file {name!r}") from None
    kind = _TYPES[name.rsplit(".", 1)[1]]
    return web.Response(body=body, content_type=kind, charset="utf-8", headers=HEADERS)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", root)
    app.router.add_get("/console", root)
    app.router.add_get("/console/", index)
    app.router.add_get("/console/{name}", asset)

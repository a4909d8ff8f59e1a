"""Bearer-token authentication for the dispatch API and the console's data.

The token (``METEORSEED_API_TOKEN`` or ``--token``) is compared in constant time. The OpenAPI
description and the console's static page carry no data and are public; everything they fetch
needs the token.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from meteorseed_scrapy.api.config import CONFIG
from meteorseed_scrapy.api.problems import Handler, problem

#: Paths (exact) and prefixes served without a token: nothing behind them reads Redis.
PUBLIC_PATHS = frozenset({"/", "/console", "/openapi.json"})
PUBLIC_PREFIXES = ("/console/",)
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="meteorseed"'}


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def token_matches(expected: bytes, header: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``expected`` as a bearer token."""
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # compare_digest takes time independent of where the two differ.
    return hmac.compare_digest(given.strip().encode("utf-8", "replace"), expected)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[CONFIG].token
    if token is None or is_public(request.path):
        return await handler(request)
    header = request.headers.get("Authorization")
    if not token_matches(token.encode("utf-8"), header):
        detail = ("missing bearer token (Authorization: Bearer <METEORSEED_API_TOKEN>)"
                  if not header else "invalid bearer token")
        return problem(401, detail, headers=_CHALLENGE)
    return await handler(request)

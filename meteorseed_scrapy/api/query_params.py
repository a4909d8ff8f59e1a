"""Query parameters an operation does not have are refused, named (``422``, ``query.<name>``).

Ignored, a misspelt filter would answer for everything (``/dead-letters?site=news``: every
site's dead letters). Which parameters an operation has is what its OpenAPI description says
(:mod:`.openapi`), so the description and the check cannot disagree. The public pages (the
console's page and assets, the description itself) read no data for a query to filter, and take
any (a link's tracking parameters).
"""

from __future__ import annotations

import functools

from aiohttp import web

from meteorseed_scrapy.api.auth import is_public
from meteorseed_scrapy.api.openapi import build_spec
from meteorseed_scrapy.api.problems import FieldError, Handler, InvalidInput


@functools.cache
def _declared() -> dict[tuple[str, str], frozenset[str]]:
    """(method, path template) -> the query parameters the operation declares."""
    return {(method.upper(), path): frozenset(p["name"] for p in op.get("parameters", ())
                                              if p["in"] == "query")
            for path, ops in build_spec()["paths"].items() for method, op in ops.items()}


def unknown_query(method: str, template: str, names: list[str]) -> list[FieldError]:
    """A :class:`FieldError` for each query parameter in ``names`` (in order, once) that the
    operation ``method template`` does not declare; none for a path the API does not
    describe."""
    known = _declared().get(("GET" if method == "HEAD" else method, template))
    if known is None:
        return []
    expected = ", ".join(sorted(known)) or "none"
    return [FieldError(f"query.{name}"[:200], f"is not a parameter of {method} {template} "
                                              f"(expected {expected})")
            for name in dict.fromkeys(names) if name not in known]


@web.middleware
async def query_params_middleware(request: web.Request, handler: Handler
                                  ) -> web.StreamResponse:
    resource = request.match_info.route.resource
    if resource is not None and request.query and not is_public(request.path):
        errors = unknown_query(request.method, resource.canonical, list(request.query))
        if errors:
            raise InvalidInput(errors, "the request has query parameters its operation "
                                       "does not take")
    return await handler(request)


__all__ = ["query_params_middleware", "unknown_query"]

"""``POST /sites/{site_id}/pause|resume|limit``: the operator's hand on a site over HTTP, as
``meteorseed sites pause|resume|limit`` (:mod:`meteorseed_scrapy.politeness.control`). Who acts
is recorded as ``api@<peer address>``: the API has one token, not users."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from meteorseed_scrapy.api.problems import FieldError, InvalidInput, json_body, unknown_fields
from meteorseed_scrapy.api.state import STATE, ApiState
from meteorseed_scrapy.politeness import control
from meteorseed_scrapy.validators import ConfigError, to_integer, to_number

#: The body of ``limit`` and the fields it may hold.
LIMIT_FIELDS = frozenset({"rate", "concurrency", "reset"})


def who(request: web.Request) -> str:
    return f"api@{request.remote or 'unknown'}"


async def _ref(request: web.Request, state: ApiState) -> control.SiteRef:
    site = request.match_info["site_id"]
    await state.rules.refresh()
    config = state.rules.get(site)
    try:
        return control.SiteRef(site, (config.limits.quota_key if config else None) or "")
    except ValueError as exc:
        raise InvalidInput([FieldError("path.site_id", str(exc))]) from None


async def body_of(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    data = json_body(raw)
    if not isinstance(data, dict):
        raise InvalidInput([FieldError("body", "is not a JSON object")])
    return data


async def pause_reason(request: web.Request) -> str:
    """The ``reason`` of a pause's body (a site's or a seed's), its only field."""
    body = await body_of(request)
    errors = unknown_fields(body, {"reason"}, "a field of a pause")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 500:
        errors.append(FieldError("reason", "must be a string of at most 500 characters"))
    if errors:
        raise InvalidInput(errors)
    return reason


async def pause(request: web.Request) -> web.Response:
    state = request.app[STATE]
    ref = await _ref(request, state)
    reason = await pause_reason(request)
    new = await asyncio.to_thread(control.hold, state.sync_client, state.config.keys, ref,
                                  who(request), reason)
    return web.json_response({"site_id": ref.site, "held": True, "already": not new})


async def resume(request: web.Request) -> web.Response:
    state = request.app[STATE]
    ref = await _ref(request, state)
    woken = await asyncio.to_thread(control.release, state.sync_client, state.config.keys, ref,
                                    who(request))
    return web.json_response({"site_id": ref.site, "was_held": woken is not None,
                              "woken": woken or 0})


async def limit(request: web.Request) -> web.Response:
    state = request.app[STATE]
    ref = await _ref(request, state)
    body = await body_of(request)
    errors = unknown_fields(body, LIMIT_FIELDS, "a field of a limit")
    if body.get("reset") is True:
        if set(body) != {"reset"}:
            errors.append(FieldError("reset", "goes alone (no rate, no concurrency)"))
        if errors:
            raise InvalidInput(errors)
        gone = await asyncio.to_thread(control.unlimit, state.sync_client, state.config.keys,
                                       ref, who(request))
        return web.json_response({"site_id": ref.site, "reset": gone})
    rate = concurrency = None
    try:
        if body.get("rate") is not None:
            rate = to_number(body["rate"], "rate", positive=True)
    except ConfigError as exc:
        errors.append(FieldError("rate", exc.problem))
    try:
        if body.get("concurrency") is not None:
            concurrency = to_integer(body["concurrency"], "concurrency", minimum=1)
    except ConfigError as exc:
        errors.append(FieldError("concurrency", exc.problem))
    if "reset" in body and body["reset"] is not True:
        errors.append(FieldError("reset", "must be true when given"))
    if not errors and rate is None and concurrency is None:
        errors.append(FieldError("body", "give rate, concurrency, both, or reset: true"))
    if errors:
        raise InvalidInput(errors)
    await asyncio.to_thread(control.limit, state.sync_client, state.config.keys, ref,
                            who(request), rate=rate, concurrency=concurrency)
    return web.json_response({"site_id": ref.site, "rate": rate, "concurrency": concurrency})


async def controls(request: web.Request) -> web.Response:
    state = request.app[STATE]
    found = await asyncio.to_thread(control.controls, state.sync_client, state.config.keys)
    return web.json_response(found)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/controls", controls)
    router.add_post("/sites/{site_id}/pause", pause)
    router.add_post("/sites/{site_id}/resume", resume)
    router.add_post("/sites/{site_id}/limit", limit)

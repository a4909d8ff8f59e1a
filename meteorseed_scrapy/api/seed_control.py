"""``POST /seeds/{seed_id}/pause|resume|cancel``, ``GET /seed-controls``: the operator's hand on
a seed over HTTP, as ``meteorseed seeds pause|resume|cancel|controls``
(:mod:`meteorseed_scrapy.queue.consume.seed_control`). Who acts is recorded as
``api@<peer address>`` (the API has one token, not users)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from meteorseed_scrapy.api.problems import FieldError, InvalidInput
from meteorseed_scrapy.api.site_control import pause_reason, who
from meteorseed_scrapy.api.state import STATE
from meteorseed_scrapy.queue.consume import seed_control


def _seed(request: web.Request) -> str:
    try:
        return seed_control.checked(request.match_info["seed_id"])
    except ValueError as exc:
        raise InvalidInput([FieldError("path.seed_id", str(exc))]) from None


async def pause(request: web.Request) -> web.Response:
    state = request.app[STATE]
    seed_id = _seed(request)
    reason = await pause_reason(request)
    new = await asyncio.to_thread(seed_control.hold, state.sync_client, state.config.keys,
                                  seed_id, who(request), reason)
    return web.json_response({"seed_id": seed_id, "held": True, "already": not new})


async def resume(request: web.Request) -> web.Response:
    state = request.app[STATE]
    seed_id = _seed(request)
    woken = await asyncio.to_thread(seed_control.release, state.sync_client,
                                    state.config.keys, seed_id, who(request))
    return web.json_response({"seed_id": seed_id, "was_held": woken is not None,
                              "woken": woken or 0})


async def cancel(request: web.Request) -> web.Response:
    state = request.app[STATE]
    seed_id = _seed(request)
    removed = await asyncio.to_thread(seed_control.cancel, state.sync_client,
                                      state.config.keys, seed_id, who(request))
    return web.json_response({"seed_id": seed_id, "cancelled": True, "removed": removed})


async def controls(request: web.Request) -> web.Response:
    state = request.app[STATE]
    found = await asyncio.to_thread(seed_control.controls, state.sync_client, state.config.keys)
    return web.json_response(found)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/seed-controls", controls)
    router.add_post("/seeds/{seed_id}/pause", pause)
    router.add_post("/seeds/{seed_id}/resume", resume)
    router.add_post("/seeds/{seed_id}/cancel", cancel)

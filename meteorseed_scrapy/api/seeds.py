"""``GET /seeds``, ``GET /seeds/{id}``, ``DELETE /seeds/{id}``: the seed registry over HTTP.

A seed's record (its definition and run state) comes from the shared registry, so seeds that
``meteorseed`` seeders or other servers registered show too; ``expansion`` is added for a seed
this server is expanding (or expanded lately), with its counts so far.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from meteorseed_scrapy.api.problems import FieldError, InvalidInput, problem
from meteorseed_scrapy.api.state import STATE, ApiState

#: Seeds per page. A seed's payload may be 2 MiB, so a page leaves payloads out (their size is
#: given); ``GET /seeds/{id}`` has the seed in full.
MAX_LIMIT = 200


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput([FieldError(f"query.{name}", f"must be an integer, got {raw[:50]!r}")]
                           ) from None
    if not low <= value <= high:
        raise InvalidInput([FieldError(f"query.{name}", f"must be between {low} and {high}")])
    return value


def _shown(state: ApiState, record: Any, full: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = dict(record.to_json())
    if not full:
        seed = dict(out["seed"])
        payload = seed.pop("payload", {})
        seed["payload_bytes"] = len(json.dumps(payload, ensure_ascii=False).encode("utf-8"))
        out["seed"] = seed
    progress = state.expansions.get(record.seed.seed_id)
    out["expansion"] = progress.to_json() if progress is not None else None
    return out


async def list_seeds(request: web.Request) -> web.Response:
    state = request.app[STATE]
    offset = _int_param(request, "offset", 0, 0, 10**9)
    limit = _int_param(request, "limit", 100, 1, MAX_LIMIT)
    site_id = request.query.get("site_id") or None
    records = await state.registry.list(site_id=site_id, offset=offset, limit=limit)
    return web.json_response({
        "total": await state.registry.count(),
        "offset": offset,
        "limit": limit,
        "site_id": site_id,
        "seeds": [_shown(state, r, full=False) for r in records],
    })


async def get_seed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    seed_id = request.match_info["seed_id"]
    record = await state.registry.get(seed_id)
    if record is None:
        return problem(404, f"no seed {seed_id!r}")
    return web.json_response(_shown(state, record))


async def delete_seed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    seed_id = request.match_info["seed_id"]
    # Stop its expansion first, so no task of it is enqueued after the answer.
    cancelled = await state.expansions.cancel(seed_id)
    if not await state.registry.delete(seed_id):
        return problem(404, f"no seed {seed_id!r}")
    return web.json_response({"deleted": seed_id, "expansion_cancelled": cancelled})

"""``GET /seeds``, ``GET /seeds/{id}``, ``DELETE /seeds/{id}``: the seed registry over HTTP;
``GET /seeds/{id}/items``: a seed's stored items, paged.

A seed's record (its definition and run state) comes from the shared registry, so seeds that
``meteorseed`` seeders or other servers registered show too; ``expansion`` is added for a seed
this server is expanding (or expanded lately), with its counts so far, and ``progress`` for
every seed whose tasks were counted (:mod:`meteorseed_scrapy.queue.fleet.crawl_progress`: what
became
of its tasks, whether it finished and when).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from meteorseed_scrapy.api.problems import FieldError, InvalidInput, problem
from meteorseed_scrapy.api.state import STATE
from meteorseed_scrapy.queue.consume.seed_control import control_of, controls
from meteorseed_scrapy.queue.fleet.crawl_progress import read_progress, seed_keys
from meteorseed_scrapy.store.base import Store

#: Seeds per page. A seed's payload may be 2 MiB, so a page leaves payloads out (their size is
#: given); ``GET /seeds/{id}`` has the seed in full.
MAX_LIMIT = 200
#: Items per page of ``GET /seeds/{id}/items``: at most, and unless ``limit`` says otherwise.
MAX_ITEMS = 1000
ITEMS_LIMIT = 100


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


def _shown(record: Any, progress: dict[str, Any] | None, expansion: dict[str, Any] | None,
           full: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = dict(record.to_json())
    out["progress"] = progress
    if not full:
        seed = dict(out["seed"])
        payload = seed.pop("payload", {})
        seed["payload_bytes"] = len(json.dumps(payload, ensure_ascii=False).encode("utf-8"))
        out["seed"] = seed
    out["expansion"] = expansion
    return out


async def list_seeds(request: web.Request) -> web.Response:
    state = request.app[STATE]
    offset = _int_param(request, "offset", 0, 0, 10**9)
    limit = _int_param(request, "limit", 100, 1, MAX_LIMIT)
    site_id = request.query.get("site_id") or None
    expansions = state.expansions.shown()  # (before the registry: see Expansions.shown)
    records = await state.registry.list(site_id=site_id, offset=offset, limit=limit)
    progress = await read_progress(state.client, state.config.keys,
                                   [r.seed.seed_id for r in records])
    # (held or cancelled, as GET /seeds/{id}'s: meteorseed_scrapy.queue.consume.seed_control)
    found = await asyncio.to_thread(controls, state.sync_client, state.config.keys)
    return web.json_response({
        "total": await state.registry.count(),
        "offset": offset,
        "limit": limit,
        "site_id": site_id,
        "seeds": [{**_shown(r, progress[r.seed.seed_id], expansions.get(r.seed.seed_id),
                            full=False),
                   "control": found.get(r.seed.seed_id)} for r in records],
    })


async def get_seed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    seed_id = request.match_info["seed_id"]
    expansion = state.expansions.shown(seed_id).get(seed_id)  # (first: Expansions.shown)
    record = await state.registry.get(seed_id)
    progress = (await read_progress(state.client, state.config.keys, [seed_id]))[seed_id]
    # (held or cancelled: meteorseed_scrapy.queue.consume.seed_control)
    control = await asyncio.to_thread(control_of, state.sync_client, state.config.keys, seed_id)
    if record is None:
        if progress is None and control is None:
            return problem(404, f"no seed {seed_id!r}")
        # Counted but no longer (or never) registered: its progress alone.
        return web.json_response({"seed": {"seed_id": seed_id}, "progress": progress,
                                  "control": control})
    return web.json_response({**_shown(record, progress, expansion), "control": control})


async def delete_seed(request: web.Request) -> web.Response:
    state = request.app[STATE]
    seed_id = request.match_info["seed_id"]
    # Stop its expansion first, so no task of it is enqueued after the answer.
    cancelled = await state.expansions.cancel(seed_id)
    if not await state.registry.delete(seed_id):
        return problem(404, f"no seed {seed_id!r}")
    # Its progress is forgotten with it (tasks still queued are counted afresh as they settle).
    for key in seed_keys(state.config.keys, seed_id):  # (one slot each on a cluster)
        await state.client.delete(key)
    return web.json_response({"deleted": seed_id, "expansion_cancelled": cancelled})


class SeedItems:
    """The store read by ``GET /seeds/{id}/items``: opened at the first request, on one
    thread of its own (an SQLite connection stays on the thread that opened it)."""

    def __init__(self, store_uri: str | None, namespace: str) -> None:
        self.store_uri, self.namespace = store_uri, namespace
        self._store: Store | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="meteorseed-seed-items")

    def _page(self, seed_id: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        if self._store is None:
            from meteorseed_scrapy.store.backends import open_store  # (its drivers: lazily)

            self._store = open_store(str(self.store_uri), self.namespace, None)
        return self._store.seed_items_page(seed_id, after, limit)

    async def page(self, seed_id: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, self._page, seed_id, after, limit)

    def close(self) -> None:
        def close_store() -> None:
            if self._store is not None:
                self._store.close()

        self._thread.submit(close_store)
        self._thread.shutdown(wait=True)


SEED_ITEMS = web.AppKey("seed_items", SeedItems)


async def seed_items(request: web.Request) -> web.Response:
    """A page of the seed's stored items in ``_id`` order: ``after`` (the ``next`` of the
    page before) is the cursor, ``limit`` at most :data:`MAX_ITEMS`."""
    reader = request.app[SEED_ITEMS]
    if not reader.store_uri:
        return problem(503, "no store configured (meteorseed serve --store-uri)")
    seed_id = request.match_info["seed_id"]
    limit = _int_param(request, "limit", ITEMS_LIMIT, 1, MAX_ITEMS)
    after = request.query.get("after")
    if after is not None and (not after or len(after) > 2000):
        raise InvalidInput([FieldError("query.after", "must be an item _id (the next of the "
                                       "page before), 1 to 2000 characters")])
    items = await reader.page(seed_id, after, limit)
    return web.json_response({
        "seed_id": seed_id, "limit": limit, "after": after, "items": items,
        "next": items[-1]["_id"] if len(items) == limit else None,
    }, dumps=lambda v: json.dumps(v, ensure_ascii=False, default=str))

"""The console's dead letters: list, inspect, requeue (``meteorseed dead``'s functions).

:mod:`meteorseed_scrapy.queue.consume.deadletters` uses synchronous redis-py; its calls run in
worker
threads so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from meteorseed_scrapy.api.problems import FieldError, InvalidInput, problem
from meteorseed_scrapy.api.state import STATE
from meteorseed_scrapy.queue.consume import deadletters


def _letter_id(request: web.Request) -> str:
    letter_id = request.match_info["letter_id"]
    if not deadletters.LETTER_ID.match(letter_id):
        raise InvalidInput([FieldError(
            "path.id", f"must be a dead-letter id ({deadletters.LETTER_ID_FORM})")])
    return letter_id


async def list_dead(request: web.Request) -> web.Response:
    state = request.app[STATE]
    raw = request.query.get("limit", "50")
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise InvalidInput([FieldError("query.limit", "must be an integer from 1 to 1000")])
    limit, site = int(raw), request.query.get("site_id") or None

    def read() -> list[dict[str, Any]]:
        rows = []
        for letter in deadletters.iter_dead(state.sync_client, state.config.keys, site=site):
            row = letter.summary()
            # Durable retries it used (each a new delivery of a new entry), besides the
            # deliveries of its last entry: the console shows both.
            row["retries"] = letter.task.retry_count if letter.task else None
            rows.append(row)
            if len(rows) == limit:
                break
        return rows

    rows = await asyncio.to_thread(read)
    total = 0
    for dead in state.config.keys.deads:  # one per shard
        total += int(await state.client.xlen(dead))
    return web.json_response({"total": total, "site_id": site, "dead_letters": rows})


async def show_dead(request: web.Request) -> web.Response:
    state = request.app[STATE]
    letter_id = _letter_id(request)
    found, _ = await asyncio.to_thread(deadletters.fetch, state.sync_client, state.config.keys,
                                       [letter_id])
    if not found:
        return problem(404, f"no dead letter {letter_id}")
    letter = found[0]
    shown = letter.summary()
    shown["task"] = letter.task.to_dict() if letter.task else None
    shown["payload"] = letter.fields.get("t", "")
    return web.json_response(shown)


async def requeue_dead(request: web.Request) -> web.Response:
    state = request.app[STATE]
    letter_id = _letter_id(request)
    keys = state.config.keys

    def run() -> deadletters.RequeueResult:
        found, missing = deadletters.fetch(state.sync_client, keys, [letter_id])
        result = deadletters.RequeueResult(missing=missing)
        return deadletters.requeue(state.sync_client, keys, found, result,
                                   fingerprinter=state.config.fingerprinter)

    result = await asyncio.to_thread(run)
    if result.missing:
        return problem(404, f"no dead letter {letter_id}")
    if result.kept:
        return problem(409, f"cannot requeue {letter_id}: {result.kept[0]['error']}")
    return web.json_response({"requeued": result.requeued[0]})

"""``GET /tasks/{task_id}`` and ``GET /tasks?url=``: where one task is, as ``meteorseed task``
says it (the one reader, :mod:`meteorseed_scrapy.queue.inspect.task_state`, on the asyncio client).

Always 200 with the answer when the query is valid: ``state`` is ``not found`` when no
structure searched holds it, and ``searched``/``exhaustive`` say how far each search went.
"""

from __future__ import annotations

from aiohttp import web

from meteorseed_scrapy.api.problems import FieldError, InvalidInput
from meteorseed_scrapy.api.state import STATE
from meteorseed_scrapy.queue.inspect.task_query import TaskQuery, query_for_id, query_for_url
from meteorseed_scrapy.queue.inspect.task_state import task_state_plan
from meteorseed_scrapy.queue.plumbing.reads import run_async
from meteorseed_scrapy.task.validation import TaskError


def _site(request: web.Request) -> str | None:
    return request.query.get("site_id") or None


def _field(exc: TaskError, name: str) -> FieldError:
    return FieldError("query.site_id" if exc.field == "site_id" else name, exc.problem)


async def _answer(request: web.Request, query: TaskQuery) -> web.Response:
    state = request.app[STATE]
    found = await run_async(state.client, task_state_plan(state.config.keys, query))
    return web.json_response(found.to_json())


async def task_by_id(request: web.Request) -> web.Response:
    try:
        query = query_for_id(request.match_info["task_id"], "task_id", _site(request))
    except TaskError as exc:
        raise InvalidInput([_field(exc, "path.task_id")]) from None
    return await _answer(request, query)


async def task_by_url(request: web.Request) -> web.Response:
    url = request.query.get("url")
    if url is None:
        raise InvalidInput([FieldError("query.url", "is required (or use /tasks/{task_id})")])
    try:
        query = query_for_url(url, "url", _site(request),
                              fingerprinter=request.app[STATE].config.fingerprinter)
    except TaskError as exc:
        raise InvalidInput([_field(exc, "query.url")]) from None
    return await _answer(request, query)

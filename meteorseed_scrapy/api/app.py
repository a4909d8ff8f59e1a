"""The aiohttp application of ``meteorseed serve``: routes, middlewares, lifecycle."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from meteorseed_scrapy import console
from meteorseed_scrapy.api import (
    dead,
    dispatch,
    history,
    monitor,
    seed_control,
    seeds,
    site_control,
    tasks,
    webhooks,
)
from meteorseed_scrapy.api.auth import auth_middleware
from meteorseed_scrapy.api.config import CONFIG, ApiConfig
from meteorseed_scrapy.api.guard import body_timeout_middleware, local_only_middleware
from meteorseed_scrapy.api.openapi import build_spec
from meteorseed_scrapy.api.problems import problem_middleware
from meteorseed_scrapy.api.query_params import query_params_middleware
from meteorseed_scrapy.api.state import STATE, ApiState
from meteorseed_scrapy.queue.inspect.status import Throughput

logger = logging.getLogger(__name__)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(build_spec(), dumps=lambda v: json.dumps(v, ensure_ascii=False))


def create_app(config: ApiConfig) -> web.Application:
    """The application; Redis is first used by a request, so it starts with Redis down."""
    # client_max_size: aiohttp answers a larger body with 413 before it is read into memory.
    app = web.Application(client_max_size=config.max_body,
                          middlewares=[local_only_middleware, problem_middleware,
                                       auth_middleware, query_params_middleware,
                                       body_timeout_middleware])
    app[CONFIG] = config
    app[monitor.THROUGHPUT] = Throughput()
    app[monitor.ANOMALIES] = monitor.AnomalyCounts(config.store_uri, config.namespace)
    app[monitor.KNOWN_SITES] = monitor.KnownSites()
    app[history.HISTORY] = history.History()
    app[seeds.SEED_ITEMS] = seeds.SeedItems(config.store_uri, config.namespace)
    app.cleanup_ctx.append(_lifecycle)
    app.cleanup_ctx.append(history.sampling)  # (after _lifecycle: it needs the state)
    app.cleanup_ctx.append(webhooks.deliveries)  # (the same)
    app.on_shutdown.append(_stop_expansions)
    r = app.router
    r.add_get("/openapi.json", openapi)
    r.add_post("/dispatch", dispatch.dispatch)
    r.add_get("/seeds", seeds.list_seeds)
    r.add_get("/seeds/{seed_id}", seeds.get_seed)
    r.add_get("/seeds/{seed_id}/items", seeds.seed_items)
    r.add_delete("/seeds/{seed_id}", seeds.delete_seed)
    r.add_get("/status", monitor.overview)
    r.add_get("/sites", monitor.sites)
    r.add_get("/history", history.history)
    r.add_get("/tasks", tasks.task_by_url)
    r.add_get("/tasks/{task_id}", tasks.task_by_id)
    r.add_get("/dead-letters", dead.list_dead)
    r.add_get("/dead-letters/{letter_id}", dead.show_dead)
    r.add_post("/dead-letters/{letter_id}/requeue", dead.requeue_dead)
    site_control.add_routes(r)
    seed_control.add_routes(r)
    console.add_routes(app)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    state = ApiState.build(app[CONFIG])
    app[STATE] = state
    yield
    await state.close()
    app[seeds.SEED_ITEMS].close()


async def _stop_expansions(app: web.Application) -> None:
    # Background expansions stop before connections close (graceful shutdown); a stopped seed
    # keeps what it enqueued, and its registry record says when it last ran.
    await app[STATE].expansions.cancel_all()

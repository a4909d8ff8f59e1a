"""``meteorseed serve`` delivers the completion webhooks of its namespace while it runs, when
``METEORSEED_NOTIFY_SECRET`` is set (:mod:`meteorseed_scrapy.observability.notify`; several
servers share the work through one consumer group)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from meteorseed_scrapy.api.config import CONFIG
from meteorseed_scrapy.api.state import STATE
from meteorseed_scrapy.observability.notify import SECRET_SETTING, Deliverer, registry_lookup

logger = logging.getLogger(__name__)


async def deliveries(app: web.Application) -> AsyncIterator[None]:
    """Cleanup context (after the state's): the deliverer runs from startup to cleanup; a
    call under way when the server stops stays pending and another deliverer makes it."""
    config = app[CONFIG].notify
    if config is None or not config.enabled:
        logger.info("Completion webhooks are not sent (%s is not set)", SECRET_SETTING)
        yield
        return
    state = app[STATE]
    deliverer = Deliverer(state.client, state.config.keys, config,
                          registry_lookup(state.registry.get))
    task = asyncio.ensure_future(deliverer.run())
    logger.info("Completion webhooks: delivering from %s", state.config.keys.events)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


__all__ = ["deliveries"]

"""Expanding a seed whose expansion blocks (a sitemap is fetched with urllib) on a thread of
its own, with its own event loop and Redis connection, so that the seeder's loop goes on
renewing the seed's lease and answering signals meanwhile."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import redis.asyncio

from meteorseed_scrapy.queue.connection import clone_async
from meteorseed_scrapy.queue.writer import TaskWriter
from meteorseed_scrapy.seeding.expand import ExpandSummary, expand_stream

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.keys import KeyLayout


def clone_client(client: redis.asyncio.Redis) -> redis.asyncio.Redis:
    """A new client for the same server and options (an asyncio client belongs to one
    event loop)."""
    clone: redis.asyncio.Redis = clone_async(client)
    return clone


async def expand_on_thread(client: redis.asyncio.Redis, keys: KeyLayout, line: str,
                           summary: ExpandSummary, fingerprinter: Any = None,
                           **kwargs: Any) -> None:
    """:func:`expand_stream` of one seed line on a worker thread; ``summary`` fills in as it
    goes. Cancelling this cancels the thread's expansion at its next await (a fetch already
    under way finishes first, within its timeout)."""
    lock = threading.Lock()
    state: dict[str, Any] = {"cancelled": False}

    async def main() -> None:
        with lock:  # (either it is cancelled before it starts, or its task can be cancelled)
            if state["cancelled"]:
                return
            state["loop"], state["task"] = asyncio.get_running_loop(), asyncio.current_task()
        own = clone_client(client)
        try:
            await expand_stream([line], TaskWriter(own, keys, fingerprinter=fingerprinter),
                                summary=summary, **kwargs)
        finally:
            await own.aclose()

    try:
        await asyncio.to_thread(lambda: asyncio.run(main()))
    except asyncio.CancelledError:
        with lock:
            state["cancelled"] = True
            if "task" in state:
                state["loop"].call_soon_threadsafe(state["task"].cancel)
        raise

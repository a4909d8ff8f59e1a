"""What the running server holds: Redis clients, the writer, the seed registry, expansions.

Built by :func:`meteorseed_scrapy.api.app.create_app`'s startup hook (no I/O in constructors:
a redis-py client connects at its first command) and closed by its cleanup hook.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from meteorseed_scrapy.api.config import ApiConfig
from meteorseed_scrapy.api.expansion import ExpansionPool, ExpansionState, Progress
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis, SyncRedis, async_client
from meteorseed_scrapy.queue.plumbing.connection import sync_client as sync_client_for
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.sites.remote import RemoteRules

logger = logging.getLogger(__name__)

#: Finished expansions remembered for ``GET /seeds/{id}`` (the registry keeps the run itself).
MAX_FINISHED = 1000


class Expansions:
    """Expansions started by this server, by seed id: running ones and the latest finished."""

    def __init__(self) -> None:
        self._progress: dict[str, Progress] = {}
        self._tasks: dict[str, asyncio.Future[None]] = {}

    def add(self, progress: Progress) -> None:
        """Track ``progress`` (state ``expanding``: the seed_id is taken until it ends)."""
        self._progress.pop(progress.seed_id, None)
        self._progress[progress.seed_id] = progress  # (re)inserted last: newest at the end
        while len(self._progress) > MAX_FINISHED:
            oldest = next((s for s, p in self._progress.items()
                           if p.state is not ExpansionState.EXPANDING), None)
            if oldest is None:
                break
            del self._progress[oldest]

    def attach(self, seed_id: str, task: asyncio.Future[None]) -> None:
        """The background task expanding ``seed_id`` (cancelled by :meth:`cancel`)."""
        self._tasks[seed_id] = task
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[None]) -> None:
        for seed_id, running in list(self._tasks.items()):
            if running is task:
                del self._tasks[seed_id]
        if not task.cancelled() and task.exception() is not None:
            logger.debug("background expansion ended with %r", task.exception())

    def has_task(self, seed_id: str) -> bool:
        return seed_id in self._tasks

    def shown(self, seed_id: str | None = None) -> dict[str, dict[str, Any]]:
        """The expansions (``seed_id``'s alone, if given) as ``GET /seeds`` shows them, now.
        Taken before the registry is read: an expansion finishes only once its run is
        recorded there (``dispatch._run``), so one shown finished always comes with its run
        (read the other way round, a run could end between the two reads: "done" with no
        run)."""
        if seed_id is not None:
            progress = self._progress.get(seed_id)
            return {} if progress is None else {seed_id: progress.to_json()}
        return {sid: progress.to_json() for sid, progress in self._progress.items()}

    def running(self, seed_id: str) -> bool:
        progress = self._progress.get(seed_id)
        return progress is not None and progress.state is ExpansionState.EXPANDING

    async def cancel(self, seed_id: str) -> bool:
        """Stop a background expansion; True when one was running."""
        task = self._tasks.get(seed_id)
        if task is None:
            return False
        progress = self._progress.get(seed_id)
        if progress is not None:
            progress.stop_requested = True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return True

    async def cancel_all(self) -> None:
        for seed_id in list(self._tasks):
            await self.cancel(seed_id)


@dataclass
class ApiState:
    config: ApiConfig
    client: AsyncRedis
    #: A synchronous client for the CLI's data functions, run in worker threads.
    sync_client: SyncRedis
    writer: TaskWriter
    registry: SeedRegistry
    rules: SiteConfigs
    expansions: Expansions = field(default_factory=Expansions)
    #: threads of background expansions, and how many may run at once
    pool: ExpansionPool = field(default_factory=ExpansionPool)

    @classmethod
    def build(cls, config: ApiConfig) -> ApiState:
        url, timeout = config.redis_url, config.redis_timeout
        client = async_client(url, decode_responses=True, socket_connect_timeout=timeout,
                              socket_timeout=30)
        sync_client = sync_client_for(url, decode_responses=True,
                                      socket_connect_timeout=timeout, socket_timeout=30)
        keys = config.keys
        return cls(
            config=config,
            client=client,
            sync_client=sync_client,
            writer=TaskWriter(client, keys, fingerprinter=config.fingerprinter),
            registry=SeedRegistry(client, keys),
            # Rules pushed to the namespace always count; --sites-dir adds local files.
            rules=SiteConfigs(config.sites_dir, RemoteRules(sync_client, keys)),
            pool=ExpansionPool(config.max_expansions),
        )

    async def close(self) -> None:
        await self.expansions.cancel_all()
        self.pool.shutdown()
        await self.client.aclose()
        # The blocking client is closed once no thread uses it (a cancelled request's read,
        # the history sampler's look at the rules): redis-py closing the pool under a thread
        # that was connecting left that thread waiting for a reply past the server's stop.
        await asyncio.get_running_loop().shutdown_default_executor()
        self.sync_client.close()  # (sockets closed, nothing awaited: no thread needed)


STATE = web.AppKey("state", ApiState)

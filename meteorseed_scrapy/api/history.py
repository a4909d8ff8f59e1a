"""``GET /history``: the console's charts of the last hour, from a sampler running in the server.

Every :data:`INTERVAL_S` the server takes the queue snapshot of :mod:`meteorseed_scrapy.queue
.inspect.status` (the one ``GET /status`` returns) and reads each known site's fleet health window
(``<ns>:{site}:health``, the breaker's per-second counters), and keeps one small sample of
them in a ring buffer of :data:`SIZE` (an hour). Nothing is stored in Redis: a restarted server
starts a new hour. It also remembers the consumers it saw, so that the console can say which
workers were reading the streams and when they were last seen after they left (a worker
deletes its consumer on a clean stop, so Redis forgets it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from meteorseed_scrapy.api.monitor import KnownSites, health_window
from meteorseed_scrapy.api.state import STATE, ApiState
from meteorseed_scrapy.queue.fleet.snapshot import QueueStatus
from meteorseed_scrapy.queue.inspect.status import QueueSampler

logger = logging.getLogger(__name__)

#: Seconds between two samples, and samples kept (an hour of them).
INTERVAL_S = 10.0
SIZE = 360
#: Sites whose request rate a sample keeps (the busiest of that moment).
MAX_SITES = 8
#: Departed consumers remembered (the most recently seen).
MAX_GONE = 20


class History:
    """A ring buffer of samples, and the consumers seen (see the module's doc)."""

    def __init__(self, interval_s: float | None = None, size: int = SIZE) -> None:
        interval_s = INTERVAL_S if interval_s is None else interval_s
        if interval_s <= 0 or size < 2:
            raise ValueError(f"interval_s must be > 0 and size >= 2, got {interval_s}, {size}")
        self.interval_s = interval_s
        self.samples: deque[dict[str, Any]] = deque(maxlen=size)
        self.error: str | None = None
        self._seen: dict[str, tuple[float, int]] = {}  # consumer -> (last seen at, pending)
        self._present: set[str] = set()
        self._last: tuple[float, int, int] | None = None  # (at, added, finished)
        # Its own cache of the sites found: a sample at startup must not hide, for the
        # cache's life, the sites that GET /sites would find a moment later.
        self.known = KnownSites()

    def note_consumers(self, status: QueueStatus) -> None:
        """Remember the consumers of a snapshot (``GET /status`` passes its own too)."""
        self._present = {c.name for c in status.consumers}
        for c in status.consumers:
            self._seen[c.name] = (c.last_seen_at, c.pending)
        gone = sorted((n for n in self._seen if n not in self._present),
                      key=lambda n: -self._seen[n][0])
        for name in gone[MAX_GONE:]:
            del self._seen[name]

    def gone(self) -> list[dict[str, Any]]:
        """Consumers seen before that are no longer in any stream's group, latest first."""
        rows = [{"name": n, "last_seen_at": round(at, 3), "pending": pending}
                for n, (at, pending) in self._seen.items() if n not in self._present]
        return sorted(rows, key=lambda r: -r["last_seen_at"])

    def record(self, status: QueueStatus, sites: dict[str, tuple[int, int, int]],
               span_s: float) -> dict[str, Any]:
        """Add the sample of ``status`` and of ``sites`` (requests, errors, summed latency ms
        over the last ``span_s`` seconds, per site)."""
        self.note_consumers(status)
        added_rate = finished_rate = None
        finished = status.finished
        if status.added is not None and finished is not None:
            last = self._last
            if last is not None and status.at > last[0] and status.added >= last[1]:
                dt = status.at - last[0]
                added_rate = round((status.added - last[1]) / dt, 3)
                finished_rate = round(max(0, finished - last[2]) / dt, 3)
            self._last = (status.at, status.added, finished)
        else:
            self._last = None  # unreadable counter: no rate across the gap
        n = sum(v[0] for v in sites.values())
        errors = sum(v[1] for v in sites.values())
        latency = sum(v[2] for v in sites.values())
        busiest = sorted(((s, v[0]) for s, v in sites.items() if v[0]),
                         key=lambda sv: (-sv[1], sv[0]))[:MAX_SITES]
        sample = {
            "at": round(status.at, 3), "backlog": status.backlog, "pending": status.pending,
            "delayed": status.delayed.total, "dead": status.dead,
            "added_per_s": added_rate, "finished_per_s": finished_rate,
            "requests_per_s": round(n / span_s, 3),
            "error_ratio": round(errors / n, 4) if n else None,
            "latency_ms": round(latency / n, 1) if n else None,
            "sites": {s: round(count / span_s, 3) for s, count in busiest},
        }
        self.samples.append(sample)
        self.error = None
        return sample

    def to_json(self) -> dict[str, Any]:
        samples = list(self.samples)
        totals: dict[str, float] = {}
        for sample in samples:
            for site, rate in sample["sites"].items():
                totals[site] = totals.get(site, 0.0) + rate
        sites = sorted(totals, key=lambda s: (-totals[s], s))[:MAX_SITES]
        return {"interval_s": self.interval_s, "size": self.samples.maxlen,
                "samples": samples, "sites": sites, "consumers_gone": self.gone(),
                "error": self.error}


HISTORY = web.AppKey("history", History)


async def take_sample(app: web.Application) -> dict[str, Any]:
    """One sample: the queue snapshot, then the health windows of the known sites."""
    state: ApiState = app[STATE]
    history = app[HISTORY]
    keys = state.config.keys
    status = await QueueSampler(state.config.redis_url, keys, client=state.client).sample()
    await state.rules.refresh()
    names = sorted(await history.known.get(state) | set(state.rules.sites))
    span = max(1.0, history.interval_s)
    now_s = int(status.at)
    sites: dict[str, tuple[int, int, int]] = {}
    if names:
        async with state.client.pipeline(transaction=False) as pipe:
            for site in names:
                config = state.rules.get(site)
                quota = (config.limits.quota_key if config is not None else None) or site
                pipe.hgetall(keys.site_own(site, quota, "health"))
            replies = await pipe.execute()
        for site, health in zip(names, replies, strict=True):
            sites[site] = health_window(health, now_s, span)
    return history.record(status, sites, span)


async def _sampler(app: web.Application, stop: asyncio.Event) -> None:
    history = app[HISTORY]
    while not stop.is_set():
        started = time.monotonic()
        try:
            await take_sample(app)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis down: a gap in the charts, said on the page
            history.error = f"{type(exc).__name__}: {exc}"
            logger.debug("history sample failed: %s", history.error)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                stop.wait(), max(0.0, history.interval_s - (time.monotonic() - started)))


async def sampling(app: web.Application) -> AsyncIterator[None]:
    """A cleanup context (after the one building the state): the sampler runs while the
    server does. It stops on ``stop`` as well as on its cancel: a cancel that lands inside a
    sample can be swallowed there (the server then took a whole interval to shut down)."""
    stop = asyncio.Event()
    task = asyncio.create_task(_sampler(app, stop), name="meteorseed-history")
    yield
    stop.set()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def history(request: web.Request) -> web.Response:
    return web.json_response(request.app[HISTORY].to_json())

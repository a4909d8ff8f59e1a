"""The console's data: the overview (queue, delayed tasks, throughput) and the sites (breakers,
rates).

The queue snapshot is :mod:`meteorseed_scrapy.queue.inspect.status`'s, the one reader ``meteorseed
status`` and the workers use too (a few cheap reads, fine every 2 s per open console; the CLI
also SCANs for dedup roots, too heavy to repeat that often on a big Redis). Per-site politeness
state is read from the keys documented in :mod:`meteorseed_scrapy.queue.keys`; anything
synchronous (SCAN, the store) runs in a worker thread so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from meteorseed_scrapy.api.state import STATE, ApiState
from meteorseed_scrapy.politeness.breaker import BreakerConfig, BreakerState
from meteorseed_scrapy.queue.fleet.spiders import with_registered
from meteorseed_scrapy.queue.inspect.status import QueueSampler, Throughput
from meteorseed_scrapy.queue.scan import scan_namespace
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.settings import DEFAULTS

#: Sites listed on the sites page (found by their politeness keys, rule files, dedup roots).
MAX_SITES = 500

THROUGHPUT = web.AppKey("throughput", Throughput)


async def overview(request: web.Request) -> web.Response:
    state = request.app[STATE]
    keys = state.config.keys
    status = await QueueSampler(state.config.redis_url, keys, client=state.client).sample()
    body = status.to_json()
    body["streams"] = list((await with_registered(state.client, keys)).streams)
    # Rates over the last minute of this server's snapshots; the totals are the snapshot's.
    body["throughput"] = request.app[THROUGHPUT].update(status)
    body["seeds"] = await state.registry.count()
    return web.json_response(body)


def _site_ids(state: ApiState) -> set[str]:
    """Sites with politeness state (``<ns>:{site}:bucket``/``breaker``) or a dedup root."""
    found: set[str] = set()
    keys = state.config.keys
    prefix = f"{keys.namespace}:"
    for suffix in ("{*}:b*", "seen:{*}"):
        for key in scan_namespace(state.sync_client, keys, suffix):
            rest = key[len(prefix):].removeprefix("seen:")
            if rest.startswith("{") and "}" in rest:
                found.add(rest[1:rest.index("}")])
            if len(found) >= MAX_SITES:
                return found
    return found


class KnownSites:
    """The sites found by :func:`_site_ids` (a SCAN of the keyspace), kept for a while: the
    sites page refreshes every 2 s, new sites appear rarely."""

    TTL_S = 30.0

    def __init__(self) -> None:
        self._found: tuple[float, set[str]] | None = None

    async def get(self, state: ApiState) -> set[str]:
        if self._found is None or time.monotonic() - self._found[0] >= self.TTL_S:
            self._found = (time.monotonic(), await asyncio.to_thread(_site_ids, state))
        return self._found[1]


KNOWN_SITES = web.AppKey("known_sites", KnownSites)


async def sites(request: web.Request) -> web.Response:
    state = request.app[STATE]
    await state.rules.refresh()
    names = sorted(await request.app[KNOWN_SITES].get(state) | set(state.rules.sites))
    names = names[:MAX_SITES]
    keys = state.config.keys
    now_s = int((await state.client.time())[0])  # (a cluster pipeline refuses TIME)
    async with state.client.pipeline(transaction=False) as pipe:
        for site in names:
            # A site sharing a quota key: pause, leases and tightening are the quota's, and
            # on a cluster its breaker lives in the quota's slot (KeyLayout.site_own).
            config = state.rules.get(site)
            quota = (config.limits.quota_key if config is not None else None) or site
            pipe.hgetall(keys.site_own(site, quota, "breaker"))
            pipe.hgetall(keys.site_own(site, quota, "health"))
            pipe.pttl(keys.site(quota, "pause"))
            pipe.zcard(keys.site(quota, "leases"))
            pipe.get(keys.site(quota, "tighten"))
        replies = await pipe.execute()
    anomalies = await request.app[ANOMALIES].counts(state)
    window = BreakerConfig().window
    rows = []
    for i, site in enumerate(names):
        breaker, health, pause_ms, leases, tighten = replies[5 * i: 5 * i + 5]
        n, errors, latency_ms = health_window(health, now_s, window)
        config = state.rules.get(site)
        limits = config.limits if config is not None else None
        rows.append({
            "site_id": site,
            "configured": config is not None,
            "breaker": breaker.get("state", BreakerState.CLOSED.value),
            "breaker_since_ms": int(breaker["since"]) if breaker.get("since") else None,
            "requests_per_s": round(n / window, 3),
            "error_ratio": round(errors / n, 3) if n else None,
            "mean_latency_ms": round(latency_ms / n) if n else None,
            "window_s": window,
            "in_flight": int(leases),
            "paused_for_s": round(int(pause_ms) / 1000, 1) if int(pause_ms) > 0 else 0,
            "rate_factor": float(tighten) if tighten else 1.0,
            "rate_limit": (limits.rate if limits and limits.rate is not None
                           else DEFAULTS["METEORSEED_SITE_RATE"]),
            "concurrency_limit": (limits.concurrency if limits and limits.concurrency
                                  is not None else DEFAULTS["METEORSEED_SITE_CONCURRENCY"]),
            "anomalies": anomalies.get(site, 0) if anomalies is not None else None,
        })
    return web.json_response({"sites": rows, "anomalies_source": request.app[ANOMALIES].source,
                              "anomalies_error": request.app[ANOMALIES].error})


def health_window(health: dict[str, str], now_s: int, window: float) -> tuple[int, int, int]:
    """Requests, errors and summed latency of the last ``window`` seconds of a site's fleet
    health window (``lua/health.lua`` keeps ``<second>:n|e|l`` counters)."""
    totals = {"n": 0, "e": 0, "l": 0}
    for name, value in health.items():
        second, _, kind = name.partition(":")
        if kind in totals and second.isdigit() and int(second) > now_s - window:
            totals[kind] += int(value)
    return totals["n"], totals["e"], totals["l"]


class AnomalyCounts:
    """Anomalies per site from the store (``--store-uri``), counted in a thread, cached."""

    TTL_S = 10.0
    MAX_COUNTED = 200_000

    def __init__(self, store_uri: str | None, namespace: str) -> None:
        self.store_uri = store_uri
        self.namespace = namespace  # (the store keeps each namespace's documents apart)
        self.source = redact(store_uri) if store_uri else None
        self.error: str | None = None
        self._cached: tuple[float, dict[str, int]] | None = None

    async def counts(self, state: ApiState) -> dict[str, int] | None:
        if not self.store_uri:
            return None
        if self._cached is not None and time.monotonic() - self._cached[0] < self.TTL_S:
            return self._cached[1]
        try:
            counts = await asyncio.to_thread(self._count, self.store_uri)
            self.error = None
        except Exception as exc:  # a store that is down must not take the page with it
            self.error = f"{type(exc).__name__}: {exc}"
            return None
        self._cached = (time.monotonic(), counts)
        return counts

    def _count(self, uri: str) -> dict[str, int]:
        from meteorseed_scrapy.store.backends import open_store

        counts: dict[str, int] = {}
        with open_store(uri, self.namespace) as store:
            for i, doc in enumerate(store.iter_anomalies()):
                if i >= self.MAX_COUNTED:
                    break
                site = str(doc.get("site_id"))
                counts[site] = counts.get(site, 0) + 1
        return counts


ANOMALIES = web.AppKey("anomalies", AnomalyCounts)

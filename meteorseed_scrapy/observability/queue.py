"""Samples of a namespace's task stream for the metrics endpoint (a few cheap reads)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from meteorseed_scrapy.keys import KeyLayout


@dataclass(frozen=True)
class QueueSample:
    length: int
    pending: int
    backlog: int  # XLEN - pending: tasks waiting to be delivered
    lag: float  # seconds since the oldest waiting task was added (0 when none waits)
    consumers: list[tuple[str, int, float]] = field(default_factory=list)  # name, pending, idle s


class QueueSampler:
    def __init__(self, redis_url: str, keys: KeyLayout, client: Any = None) -> None:
        self.keys = keys
        self.redis = client or aioredis.Redis.from_url(
            redis_url, decode_responses=True, socket_timeout=5, socket_connect_timeout=5,
        )

    async def sample(self) -> QueueSample:
        stream, group = self.keys.stream, self.keys.group
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xlen(stream)
            pipe.xinfo_groups(stream)
            pipe.xinfo_consumers(stream, group)
            replies = await pipe.execute(raise_on_error=False)
        length = replies[0] if isinstance(replies[0], int) else 0
        groups = replies[1] if isinstance(replies[1], list) else []
        info = next((g for g in groups if g.get("name") == group), None)
        if isinstance(replies[1], ResponseError) or info is None:
            return QueueSample(length, 0, length, await self._lag("0-0", length))
        pending = int(info.get("pending") or 0)
        backlog = max(0, length - pending)
        consumers = [
            (str(c["name"]), int(c.get("pending") or 0), int(c.get("idle") or 0) / 1000)
            for c in (replies[2] if isinstance(replies[2], list) else [])
        ]
        lag = await self._lag(str(info.get("last-delivered-id") or "0-0"), backlog)
        return QueueSample(length, pending, backlog, lag, consumers)

    async def _lag(self, last_delivered: str, backlog: int) -> float:
        if backlog <= 0:
            return 0.0
        entries = await self.redis.xrange(self.keys.stream, f"({last_delivered}", "+", count=1)
        if not entries:
            return 0.0
        added_ms = int(str(entries[0][0]).split("-", 1)[0])
        return max(0.0, time.time() - added_ms / 1000)

    async def close(self) -> None:
        await self.redis.aclose()

"""Samples of a namespace's task streams for the metrics endpoint (two pipelined round trips)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from meteorseed_scrapy.queue.connection import async_client
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.lanes import LANES


@dataclass(frozen=True)
class QueueSample:
    """Totals over every task stream, and (backlog, pending) per lane."""

    length: int
    pending: int
    backlog: int  # XLEN - pending: tasks waiting to be delivered
    lag: float  # seconds since the oldest waiting task was added (0 when none waits)
    consumers: list[tuple[str, int, float]] = field(default_factory=list)  # name, pending, idle s
    lanes: dict[str, tuple[int, int]] = field(default_factory=dict)  # lane -> backlog, pending


class QueueSampler:
    def __init__(self, redis_url: str, keys: KeyLayout, client: Any = None) -> None:
        self.keys = keys
        self.redis = client or async_client(
            redis_url, decode_responses=True, socket_timeout=5, socket_connect_timeout=5,
        )

    async def sample(self) -> QueueSample:
        streams, group = self.keys.streams, self.keys.group
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xlen(stream)
                pipe.xinfo_groups(stream)
                pipe.xinfo_consumers(stream, group)
            replies = await pipe.execute(raise_on_error=False)
        lanes = {lane: (0, 0) for lane in LANES}
        consumers: dict[str, tuple[int, float]] = {}  # name -> pending, least idle (s)
        waiting: list[tuple[str, str]] = []  # (stream, last delivered id) with a backlog
        length = pending = 0
        for i, stream in enumerate(streams):
            n, groups, members = replies[3 * i: 3 * i + 3]
            n = n if isinstance(n, int) else 0
            info = None
            if isinstance(groups, list):  # (a ResponseError when the stream does not exist)
                info = next((g for g in groups if g.get("name") == group), None)
            p = int(info.get("pending") or 0) if info is not None else 0
            backlog = max(0, n - p)
            length, pending = length + n, pending + p
            lane = self.keys.stream_lanes[stream][0]
            lanes[lane] = (lanes[lane][0] + backlog, lanes[lane][1] + p)
            if backlog:
                last = str(info.get("last-delivered-id") or "0-0") if info is not None else "0-0"
                waiting.append((stream, last))
            for c in members if isinstance(members, list) else []:
                name, idle = str(c["name"]), int(c.get("idle") or 0) / 1000
                before = consumers.get(name, (0, idle))
                consumers[name] = (before[0] + int(c.get("pending") or 0), min(before[1], idle))
        return QueueSample(
            length, pending, max(0, length - pending), await self._lag(waiting),
            [(name, p, idle) for name, (p, idle) in consumers.items()], lanes,
        )

    async def _lag(self, waiting: list[tuple[str, str]]) -> float:
        """Age of the oldest entry not yet delivered, over the streams that have one."""
        if not waiting:
            return 0.0
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream, last in waiting:
                pipe.xrange(stream, f"({last}", "+", count=1)
            replies = await pipe.execute()
        added = [int(str(r[0][0]).split("-", 1)[0]) for r in replies if r]
        if not added:
            return 0.0
        return max(0.0, time.time() - min(added) / 1000)

    async def close(self) -> None:
        await self.redis.aclose()

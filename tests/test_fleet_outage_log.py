"""The worker's loops log one line per Redis outage, even when some steps need no Redis.

Found on the simulated fleet (tests/test_fleet_partitions.py): a worker cut off from Redis ran
steps that had nothing to send, each "success" ended the outage and the next failure began a new
one, so a partition logged "Redis is back" / "Redis unavailable" every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from meteorseed_scrapy.queue.consume.group import ConsumerGroup
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
from meteorseed_scrapy.worker.loops import Loops


class _Stats:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def inc_value(self, key: str, n: int = 1) -> None:
        self.values[key] = self.values.get(key, 0) + n


class _Redis:
    def __init__(self) -> None:
        self.up = False

    async def ping(self) -> bool:
        if not self.up:
            raise RedisConnectionError("Error 113 connecting: No route to host")
        return True

    async def config_get(self, name: str) -> dict[str, str]:
        # Durable settings: the start-up check has nothing to warn about.
        return {name: {"maxmemory-policy": "noeviction", "appendonly": "yes"}.get(name, "")}


class _Consumer:
    def __init__(self) -> None:
        self.redis = _Redis()
        self.keys = KeyLayout("outage")
        self.consumer = "w1"

    def membership(self) -> ConsumerGroup:
        return ConsumerGroup(self.redis, self.keys, self.consumer)

    async def ensure_group(self) -> None:
        if not self.redis.up:
            raise RedisConnectionError("Error 113 connecting: No route to host")


def test_a_step_needing_no_redis_does_not_end_an_outage(caplog: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer()
    consumer.redis.up = True
    loops = Loops(consumer, _Stats(), RedisFull(None))  # type: ignore[arg-type]
    # Backoff of at most 0.3 s (a hundredth of the real one), so the test is short.
    monkeypatch.setattr("meteorseed_scrapy.backoff.random.uniform", lambda a, b: 0.01)
    calls = {"redis": 0, "local": 0}

    async def needs_redis() -> None:
        calls["redis"] += 1
        await consumer.redis.ping()

    async def local_only() -> None:  # e.g. a flush with nothing queued
        calls["local"] += 1
        await asyncio.sleep(0.01)

    async def run() -> None:
        await loops._setup()
        consumer.redis.up = False
        loops.start(needs_redis, "read")
        loops.start(local_only, "ack")
        while calls["local"] < 8 or calls["redis"] < 3:
            await asyncio.sleep(0.001)
        consumer.redis.up = True
        while loops.outage.since is not None:
            await asyncio.sleep(0.001)
        loops.stopping = True
        await loops.cancel()

    with caplog.at_level(logging.WARNING, logger="meteorseed_scrapy.worker.loops"):
        asyncio.run(asyncio.wait_for(run(), 30))
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis unavailable" in m for m in lines) == 1, lines
    assert sum("Redis is back" in m for m in lines) == 1, lines


def test_a_failure_right_after_redis_is_back_is_the_same_outage(caplog: Any) -> None:
    """A command sent during the outage may fail just after another loop saw Redis answer
    (seen on the fleet when Redis was cut off from every worker): no second outage is logged."""
    outage = Loops(_Consumer(), _Stats(), RedisFull(None)).outage  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="meteorseed_scrapy.worker.loops"):
        outage.failed(RedisConnectionError("Timeout connecting to server"), "read")
        outage.ok()
        outage.failed(RedisConnectionError("Timeout connecting to server"), "ack")  # its tail
        outage.ok()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis unavailable" in m for m in lines) == 1, lines
    assert sum("Redis is back" in m for m in lines) == 1, lines


def test_a_failure_long_after_redis_came_back_is_a_new_outage(
        caplog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    outage = Loops(_Consumer(), _Stats(), RedisFull(None)).outage  # type: ignore[arg-type]
    clock = [1000.0]
    monkeypatch.setattr("meteorseed_scrapy.worker.loops.time.monotonic", lambda: clock[0])
    with caplog.at_level(logging.WARNING, logger="meteorseed_scrapy.worker.loops"):
        outage.failed(RedisConnectionError("down"), "read")
        clock[0] += 10
        outage.ok()
        clock[0] += outage.TAIL_S + 1
        outage.failed(RedisConnectionError("down again"), "read")
        clock[0] += 3
        outage.ok()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Redis unavailable" in m for m in lines) == 2, lines
    assert [m for m in lines if "back" in m] == ["Redis is back after 10.0s: worker resumed",
                                                  "Redis is back after 3.0s: worker resumed"]


def test_a_loop_in_back_off_wakes_when_another_loop_finds_redis_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on the fleet: after a partition healed, the read loop was back at once but the acks
    waited out their own back-off (up to 30 s) before going out."""
    consumer = _Consumer()
    consumer.redis.up = True
    loops = Loops(consumer, _Stats(), RedisFull(None))  # type: ignore[arg-type]
    # A back-off far longer than the test may take: only being woken lets the ack loop retry.
    monkeypatch.setattr("meteorseed_scrapy.backoff.random.uniform", lambda a, b: 3600.0)
    calls = {"read": 0, "ack": 0}

    async def read() -> None:
        calls["read"] += 1
        await consumer.redis.ping()
        await asyncio.sleep(0.01)

    async def ack() -> None:
        calls["ack"] += 1
        await consumer.redis.ping()
        await asyncio.sleep(0.01)

    async def run() -> None:
        await loops._setup()
        consumer.redis.up = False
        loops.start(ack, "ack")
        while calls["ack"] < 1:
            await asyncio.sleep(0.001)
        consumer.redis.up = True  # the ack loop sleeps its hour-long back-off...
        loops.start(read, "read")  # ...until the read loop finds Redis answering
        while calls["ack"] < 2:
            await asyncio.sleep(0.001)
        loops.stopping = True
        await loops.cancel()

    asyncio.run(asyncio.wait_for(run(), 30))
    assert calls["ack"] >= 2


def test_a_step_that_never_suspends_does_not_starve_the_reactor() -> None:
    """A step can finish without suspending (nothing to send, an answer already buffered): the
    loop must still let the rest of the worker run. Seen as a hang of the outage test above
    when its fake ping answered at once."""
    consumer = _Consumer()
    consumer.redis.up = True
    loops = Loops(consumer, _Stats(), RedisFull(None))  # type: ignore[arg-type]
    calls = {"step": 0}
    valve = 100_000  # a starved reactor ends the test here instead of hanging it

    async def instant() -> None:
        calls["step"] += 1
        if calls["step"] >= valve:
            loops.stopping = True

    async def run() -> int:
        await loops._setup()
        loops.start(instant, "read")
        while calls["step"] < 3:
            await asyncio.sleep(0)
        seen = calls["step"]
        loops.stopping = True
        await loops.cancel()
        return seen

    assert asyncio.run(asyncio.wait_for(run(), 30)) < valve

"""Dead-letter retention: by age (Redis's clock) and by count, trimmed by the workers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from scrapy.settings import Settings

from meteorseed_scrapy.queue.consume.retention import DeadLetterRetention
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.validators import ConfigError


def fill(sync_redis: redis.Redis, keys: KeyLayout, old: int, recent: int) -> None:
    now_ms = int(sync_redis.time()[0]) * 1000  # type: ignore[index]
    for i in range(old):  # ten days old
        sync_redis.xadd(keys.dead, {"t": "{}"}, id=f"{now_ms - 10 * 86400_000 + i}-0")
    for _ in range(recent):
        sync_redis.xadd(keys.dead, {"t": "{}"})


def trim(redis_url: str, retention: DeadLetterRetention, keys: KeyLayout) -> int:
    async def main() -> int:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await retention.trim(client, keys)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_dead_letters_past_their_age_are_trimmed_and_recent_ones_kept(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    fill(sync_redis, keys, old=300, recent=50)
    removed = trim(redis_url, DeadLetterRetention(seconds=7 * 86400, maxlen=0), keys)
    left = sync_redis.xlen(keys.dead)
    # Approximate trimming drops whole nodes (100 entries): most old ones go, no recent one.
    assert removed >= 200 and left == 350 - removed and left >= 50
    assert trim(redis_url, DeadLetterRetention(seconds=0, maxlen=0), keys) == 0


def test_dead_letters_beyond_the_count_are_trimmed_oldest_first(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    fill(sync_redis, keys, old=0, recent=1000)
    newest: Any = sync_redis.xrevrange(keys.dead, count=1)
    trim(redis_url, DeadLetterRetention(seconds=0, maxlen=300), keys)
    assert 300 <= sync_redis.xlen(keys.dead) < 1000
    assert sync_redis.xrevrange(keys.dead, count=1) == newest


def test_retention_settings_are_validated_and_zero_keeps_everything() -> None:
    default = DeadLetterRetention.from_settings(Settings())
    assert (default.seconds, default.maxlen) == (30 * 86400, 1_000_000)
    off = DeadLetterRetention.from_settings(Settings({"METEORSEED_DEAD_RETENTION": 0,
                                                      "METEORSEED_DEAD_MAXLEN": 0}))
    assert not off.active
    with pytest.raises(ConfigError, match="METEORSEED_DEAD_MAXLEN"):
        DeadLetterRetention.from_settings(Settings({"METEORSEED_DEAD_MAXLEN": "lots"}))
    with pytest.raises(ConfigError, match="METEORSEED_DEAD_RETENTION"):
        DeadLetterRetention.from_settings(Settings({"METEORSEED_DEAD_RETENTION": -1}))

"""Running a coroutine against a throwaway asyncio Redis client (tests and benchmarks)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis

T = TypeVar("T")


def run_with_client(redis_url: str, fn: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
    """``fn(client)`` on a fresh event loop with a decoding client, closed afterwards."""

    async def main() -> T:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            return await fn(client)
        finally:
            await client.aclose()

    return asyncio.run(main())

"""Waiting on a condition, never on a guessed delay: :func:`wait_for` / :func:`poll_until` from a
plain thread (tests, benchmarks, the demo: no event loop needed), :func:`wait_until` inside a
coroutine (the predicate may be a coroutine function)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


def poll_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """The first truthy value ``predicate()`` returns within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def wait_for(predicate: Callable[[], Any], timeout: float = 60, interval: float = 0.1,
             error: type[Exception] = AssertionError) -> Any:
    """Like :func:`poll_until`, but raises ``error`` naming the condition when time runs out."""
    value = poll_until(predicate, timeout, interval)
    if not value:
        raise error(f"condition not met within {timeout}s: {predicate}")
    return value


async def wait_until(predicate: Callable[[], Any], timeout: float = 60, interval: float = 0.05,
                     error: type[Exception] = AssertionError) -> Any:
    """:func:`wait_for` for a coroutine: the first truthy value of ``predicate()`` (awaited
    when it returns an awaitable), polled without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise error(f"condition not met within {timeout}s: {predicate}")
        await asyncio.sleep(interval)


__all__ = ["poll_until", "wait_for", "wait_until"]

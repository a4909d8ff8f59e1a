"""Polling a condition from a plain thread (tests, benchmarks, the demo): no event loop needed."""

from __future__ import annotations

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


__all__ = ["poll_until", "wait_for"]

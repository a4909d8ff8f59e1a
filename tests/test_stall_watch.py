"""A blocked event loop is logged as such, and the Redis timeouts right after it are not
reported as Redis being unavailable (a 140 s regex stall was logged as a Redis outage)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from meteorseed_scrapy.worker.loops import Outage
from meteorseed_scrapy.worker.stall import StallWatch


def test_a_blocked_loop_is_logged_as_a_stall(caplog: pytest.LogCaptureFixture) -> None:
    watch = StallWatch()
    watch.STALL_S = 0.5

    async def main() -> None:
        watch.start()
        await asyncio.sleep(0.3)  # a beat under way
        time.sleep(1.5)  # a callback holding the loop
        await asyncio.sleep(0.6)  # the beat ends, late
        watch.stop()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert watch.last is not None and watch.last[1] >= 0.5
    assert "The event loop was blocked for" in caplog.text
    assert "not an outage" in caplog.text


def test_a_redis_timeout_right_after_a_stall_is_not_an_outage(
        caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage()
    outage.stalls.stalled(140.0)
    with caplog.at_level(logging.INFO):
        outage.failed(TimeoutError("Timeout reading from 127.0.0.1:6379"), "read")
    assert "Redis unavailable" not in caplog.text
    assert "Redis timed out during read after the event loop was blocked for 140.0 s" \
        in caplog.text


def test_without_a_stall_redis_failing_is_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage()
    outage.stalls.stalled(140.0, now=time.monotonic() - 60)  # long over
    with caplog.at_level(logging.WARNING):
        outage.failed(ConnectionError("refused"), "read")
    assert "Redis unavailable during read (refused)" in caplog.text

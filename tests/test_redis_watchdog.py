"""A batch worker that cannot reach Redis ends (exit 2, a line saying how to start a Redis);
a long-running one keeps waiting and says so once a minute."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from scrapy.signalmanager import SignalManager

from meteorseed_scrapy.worker import redis_watchdog
from meteorseed_scrapy.worker.redis_watchdog import REASON, RedisWatchdog, give_up_after
from tests.e2e_helpers import PROJECT, REPO
from tests.subprocess_env import python_path

URL = "redis://:hunter2@127.0.0.1:9/0"


class Stop(Exception):
    """Ends a watchdog that would otherwise run for ever."""


class FakeRedis:
    """Answers (True), fails (False) or stops the test (None), one ping after another, while
    the clock moves ``step`` seconds a ping."""

    def __init__(self, answers: list[bool | None], clock: list[float], step: float) -> None:
        self.answers, self.clock, self.step = list(answers), clock, step

    async def ping(self) -> bool:
        self.clock[0] += self.step
        answer = self.answers.pop(0)
        if answer is None:
            raise Stop
        if not answer:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:9")
        return True


class FakeEngine:
    def __init__(self) -> None:
        self.closed: list[str] = []
        self.spider = object()

    async def close_spider_async(self, reason: str) -> None:
        self.closed.append(reason)


def _watchdog(answers: list[bool | None], idle_close: float, step: float,
              monkeypatch: pytest.MonkeyPatch) -> tuple[RedisWatchdog, FakeEngine]:
    monkeypatch.setattr(redis_watchdog, "PING_EVERY_S", 0)
    clock = [0.0]
    engine = FakeEngine()
    stats: dict[str, Any] = {}
    crawler = SimpleNamespace(signals=SignalManager(), engine=engine,
                              stats=SimpleNamespace(set_value=stats.__setitem__))
    dog = RedisWatchdog(crawler, FakeRedis(answers, clock, step), URL, idle_close,
                        clock=lambda: clock[0])
    return dog, engine


def test_the_bound_is_at_least_30s_and_never_for_a_long_running_worker() -> None:
    assert give_up_after(3) == 30 and give_up_after(120) == 120 and give_up_after(0) == 0


def test_a_batch_worker_without_redis_from_the_start_closes_naming_url_and_remedy(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    dog, engine = _watchdog([False] * 7 + [None], idle_close=3, step=5, monkeypatch=monkeypatch)

    async def run() -> None:
        await dog.run()
        await asyncio.sleep(0)  # the close it started

    asyncio.run(run())
    assert dog.gave_up and engine.closed == [REASON]
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "redis://***@127.0.0.1:9/0 unreachable for 30s" in line and "hunter2" not in line
    assert "meteorseed redis --dir ./redis-data" in line


def test_a_batch_worker_waits_through_outages_shorter_than_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 25 s down, back, 25 s down again: never 30 s in a row.
    dog, engine = _watchdog([False] * 5 + [True] + [False] * 5 + [True, None], idle_close=3,
                            step=5, monkeypatch=monkeypatch)
    with pytest.raises(Stop):
        asyncio.run(dog.run())
    assert not dog.gave_up and engine.closed == []


def test_a_long_running_worker_keeps_waiting_and_says_so_once_a_minute(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    dog, engine = _watchdog([False] * 30 + [None], idle_close=0, step=5, monkeypatch=monkeypatch)
    with pytest.raises(Stop), caplog.at_level(logging.WARNING):
        asyncio.run(dog.run())  # 150 s without Redis
    assert not dog.gave_up and engine.closed == []
    lines = [r.getMessage() for r in caplog.records if "Still waiting" in r.getMessage()]
    assert [line.split(", unreachable for ")[1].split(" ")[0] for line in lines] == ["1m", "2m"]
    assert all("redis://***@" in line and "meteorseed redis" in line for line in lines)


def test_scrapy_crawl_without_redis_ends_non_zero_with_the_remedy(refused_port: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METEORSEED_")}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    env["PYTHONPATH"] = python_path(REPO, PROJECT)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "crawl", "probe",
         "-s", f"METEORSEED_REDIS_URL=redis://127.0.0.1:{refused_port}/0",
         "-s", "METEORSEED_IDLE_CLOSE=3"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    assert time.monotonic() - started < 90  # the bound (30 s) and a shutdown, not for ever
    assert f"Redis at redis://127.0.0.1:{refused_port}/0 unreachable for 30s" in done.stderr
    assert "meteorseed redis --dir ./redis-data" in done.stderr
    assert "Spider closed (redis_unreachable)" in done.stderr and "Traceback" not in done.stderr

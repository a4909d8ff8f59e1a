"""The API server stops when asked, whatever its history sampler is doing."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

from meteorseed_scrapy.api import background
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.sites.rulefile import FileResult
from tests.api_helpers import ApiServer, Client


def test_the_server_stops_while_its_first_sample_is_in_flight(api_server: ApiServer) -> None:
    """Stopped right after one request, as most tests stop it: the sampler's first sample is
    still running then, and the server used to wait out a sampling interval (30 s) in it."""
    server = api_server()
    with server:
        assert Client(server.url).call("GET", "/nowhere")[0] == 404
    assert not server._thread.is_alive()


def test_a_shutdown_that_hangs_says_where(api_server: ApiServer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop that cannot finish fails, with the stacks that say why, not a silent wait."""
    release = threading.Event()
    server = api_server()
    server.__enter__()
    monkeypatch.setattr(background, "STOP_TIMEOUT", 0.2)
    # The server's loop blocked in a call that outlives the stop's wait.
    assert server._loop is not None
    server._loop.call_soon_threadsafe(release.wait, 30)
    try:
        with pytest.raises(TimeoutError) as caught:
            server.stop()
        message = str(caught.value)
        assert "did not stop within 0.2 s" in message
        server_stack = message.split("--- meteorseed-api\n", 1)[1].split("\n--- ", 1)[0]
        assert "in wait" in server_stack  # the blocked call, at the top of its stack
    finally:
        release.set()
        monkeypatch.setattr(background, "STOP_TIMEOUT", 30.0)
        server.stop()


def test_the_blocking_client_closes_only_once_no_thread_reads_with_it(
        api_server: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler's look at the rules runs in a thread on the blocking client, and goes on
    after its task is cancelled. Closing that client under it (redis-py: a connect waiting
    for the reply to its handshake) left the thread, and so the server, waiting past the
    stop (seen in CI). The look here is held until the stop has done what it does first."""
    polling, release = threading.Event(), threading.Event()
    in_flight: list[bool] = []  # whether a look was under way at each close of the client
    looks = [0]
    poll = SiteConfigs._poll

    def held_poll(self: SiteConfigs) -> list[FileResult]:
        looks[0] += 1
        polling.set()
        assert release.wait(30), "the look was never released"
        try:
            return poll(self)
        finally:
            looks[0] -= 1

    close = redis.Redis.close

    def noted_close(self: redis.Redis) -> None:
        in_flight.append(looks[0] > 0)
        release.set()  # (the look ends either way: the test fails on the note, not a hang)
        close(self)

    shutdown = asyncio.BaseEventLoop.shutdown_default_executor

    async def noted_shutdown(self: asyncio.BaseEventLoop, *args: Any) -> None:
        release.set()  # the server now waits for its threads: the look may end
        await shutdown(self, *args)

    monkeypatch.setattr(SiteConfigs, "_poll", held_poll)
    monkeypatch.setattr(redis.Redis, "close", noted_close)
    monkeypatch.setattr(asyncio.BaseEventLoop, "shutdown_default_executor", noted_shutdown)
    server = api_server()
    with server:
        assert polling.wait(30), "the sampler never looked at the rules"
    assert not server._thread.is_alive()
    assert in_flight and not any(in_flight), in_flight

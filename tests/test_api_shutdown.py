"""The API server stops when asked, whatever its history sampler is doing."""

from __future__ import annotations

import threading

import pytest

from meteorseed_scrapy.api import background
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

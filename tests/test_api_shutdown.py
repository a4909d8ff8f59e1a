"""The API server stops when asked, whatever its history sampler is doing."""

from __future__ import annotations

from tests.api_helpers import ApiServer, Client


def test_the_server_stops_while_its_first_sample_is_in_flight(api_server: ApiServer) -> None:
    """Stopped right after one request, as most tests stop it: the sampler's first sample is
    still running then, and the server used to wait out a sampling interval (30 s) in it."""
    server = api_server()
    with server:
        assert Client(server.url).call("GET", "/nowhere")[0] == 404
    assert not server._thread.is_alive(), "the server thread outlived its 30 s join"

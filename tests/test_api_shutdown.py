"""The API server stops when asked, whatever its history sampler is doing."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from meteorseed_scrapy.api.background import ServerThread
from meteorseed_scrapy.api.config import ApiConfig


def test_the_server_stops_while_its_first_sample_is_in_flight(redis_url: str,
                                                                namespace: str) -> None:
    """Stopped right after one request, as most tests stop it: the sampler's first sample is
    still running then, and the server used to wait out a sampling interval (30 s) in it."""
    server = ServerThread(ApiConfig(redis_url=redis_url, namespace=namespace, token="t"))
    with server:
        request = urllib.request.Request(server.url + "/nowhere",
                                         headers={"Authorization": "Bearer t"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        refused.value.close()
        assert refused.value.code == 404
    assert not server._thread.is_alive(), "the server thread outlived its 30 s join"

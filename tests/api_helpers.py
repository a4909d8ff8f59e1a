"""What the tests of ``meteorseed serve`` share: their servers (conftest's ``api_server`` fixture,
made here) with one bearer token, a JSON client, a dispatch body and the tasks it enqueued."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import redis

from meteorseed_scrapy.api.background import ServerThread
from meteorseed_scrapy.api.config import ApiConfig
from meteorseed_scrapy.queue.keys import KeyLayout

TOKEN = "s3cret-token"

#: The ``api_server`` fixture: ``api_server(**ApiConfig fields)`` is a ServerThread on the test's
#: Redis and namespace with :data:`TOKEN` (each can be overridden; ``token=None``: no token),
#: not yet started: ``with api_server(...) as server:``.
ApiServer = Callable[..., ServerThread]


def server_factory(request: pytest.FixtureRequest) -> ApiServer:
    """The ``api_server`` fixture's factory. The test's ``redis_url`` and ``namespace`` fixtures
    are taken only when not given, so a test on a Redis Cluster starts no standalone Redis."""

    def make(**config: Any) -> ServerThread:
        config.setdefault("token", TOKEN)
        for name in ("redis_url", "namespace"):
            if name not in config:
                config[name] = request.getfixturevalue(name)
        return ServerThread(ApiConfig(**config))

    return make


class Client:
    """JSON over HTTP with the bearer token: ``call`` answers (status, headers, parsed body),
    an error status included."""

    def __init__(self, base: str, token: str | None = TOKEN) -> None:
        self.base = base
        self.token = token

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
             token: str | None = "default", headers: dict[str, str] | None = None
             ) -> tuple[int, dict[str, str], Any]:
        data = raw if raw is not None else (
            None if body is None else json.dumps(body).encode("utf-8"))
        request = urllib.request.Request(self.base + path, data=data, method=method)
        token = self.token if token == "default" else token
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, head, text = response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            status, head, text = exc.code, dict(exc.headers), exc.read()
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text.decode("utf-8", "replace")
        return status, head, parsed


def url_list(seed_id: str, urls: list[str], site_id: str = "news", **extra: Any
             ) -> dict[str, Any]:
    """A ``url_list`` seed, as ``POST /dispatch`` takes it."""
    return {"seed_id": seed_id, "site_id": site_id, "task_type": "url_list",
            "payload": {"urls": urls}, **extra}


def stream_tasks(sync_redis: redis.Redis, namespace: str) -> list[dict[str, Any]]:
    """Tasks of every task stream (each lane and band)."""
    out = []
    for stream in KeyLayout(namespace).streams:
        for _id, fields in sync_redis.xrange(stream):  # type: ignore[union-attr]
            out.append(json.loads(fields["t"]))
    return out

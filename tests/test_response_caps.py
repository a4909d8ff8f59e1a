"""Response size caps the add-on sets: a gzip bomb is refused at DOWNLOAD_MAXSIZE by Scrapy's
own HttpCompressionMiddleware (its decompressed size counts), and only the first
METEORSEED_ROBOTSTXT_MAXSIZE bytes of a robots.txt are parsed."""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.downloadermiddlewares.httpcompression import HttpCompressionMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import HtmlResponse, TextResponse
from scrapy.robotstxt import ProtegoRobotParser
from scrapy.settings import Settings
from twisted.internet.defer import Deferred

from meteorseed_scrapy.addon import MeteorSeedAddon
from meteorseed_scrapy.politeness.robotstxt import RobotsTxtMiddleware
from meteorseed_scrapy.scrapy_internals import robots_parsers
from meteorseed_scrapy.setting_checks import check_settings
from meteorseed_scrapy.settings import DEFAULTS, SCRAPY_DEFAULTS
from meteorseed_scrapy.validators import ConfigError
from tests.test_scrapy_internals import crawler


def addon_settings(**project: Any) -> Settings:
    settings = Settings()
    settings.setdict(project, priority="project")
    MeteorSeedAddon().update_settings(settings)
    return settings


def test_the_addon_caps_response_sizes_and_a_project_value_wins() -> None:
    settings = addon_settings()
    assert settings.getint("DOWNLOAD_MAXSIZE") == SCRAPY_DEFAULTS["DOWNLOAD_MAXSIZE"] \
        == 32 * 1024 * 1024  # not Scrapy's 1 GiB
    assert settings.getint("DOWNLOAD_WARNSIZE") == 8 * 1024 * 1024
    assert addon_settings(DOWNLOAD_MAXSIZE=0).getint("DOWNLOAD_MAXSIZE") == 0


def test_a_gzip_bomb_is_refused_at_the_cap_while_decompressing(
        caplog: pytest.LogCaptureFixture) -> None:
    settings = addon_settings()
    middleware = HttpCompressionMiddleware.from_crawler(
        crawler(Spider, {"DOWNLOAD_MAXSIZE": settings.getint("DOWNLOAD_MAXSIZE")}))
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB from ~64 kB
    assert len(bomb) < 100_000
    request = Request("http://127.0.0.1/bomb")
    response = HtmlResponse(request.url, body=bomb, request=request,
                            headers={"Content-Encoding": "gzip"})
    with caplog.at_level(logging.WARNING), pytest.raises(IgnoreRequest) as info:
        middleware.process_response(request, response)
    assert "exceeded DOWNLOAD_MAXSIZE (33554432 B) during decompression" in str(info.value)


def _deflate(data: bytes) -> bytes:
    return zlib.compress(data, 9)


@pytest.mark.parametrize(("encoding", "pack"), [
    ("deflate", _deflate),
    ("gzip, gzip", lambda data: gzip.compress(gzip.compress(data, 9), 9)),  # a bomb in a bomb
    ("deflate, gzip", lambda data: gzip.compress(_deflate(data), 9)),
])
def test_other_encodings_and_nested_bombs_are_refused_at_the_cap_too(
        encoding: str, pack: Any) -> None:
    """Each layer is decompressed with the cap (Scrapy's decoders all take it): a bomb that
    is deflated, or wrapped in another layer (smaller still on the wire), is no way round."""
    middleware = HttpCompressionMiddleware.from_crawler(
        crawler(Spider, {"DOWNLOAD_MAXSIZE": addon_settings().getint("DOWNLOAD_MAXSIZE")}))
    bomb = pack(b"\0" * (64 * 1024 * 1024))
    assert len(bomb) < 100_000
    request = Request("http://127.0.0.1/bomb")
    response = HtmlResponse(request.url, body=bomb, request=request,
                            headers={"Content-Encoding": encoding})
    with pytest.raises(IgnoreRequest, match=r"exceeded DOWNLOAD_MAXSIZE \(33554432 B\)"):
        middleware.process_response(request, response)


class _RecordingParser(ProtegoRobotParser):
    """Scrapy's default robots.txt parser, recording each body it is given."""

    bodies: list[bytes] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler, robotstxt_body: bytes) -> _RecordingParser:
        cls.bodies.append(robotstxt_body)
        return super().from_crawler(crawler, robotstxt_body)


def test_only_the_first_bytes_of_a_huge_robots_txt_are_parsed(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Through the installed Scrapy's own parse (whose signature differs between releases):
    the rules in the first METEORSEED_ROBOTSTXT_MAXSIZE bytes hold, the ones after are unread."""
    cap = DEFAULTS["METEORSEED_ROBOTSTXT_MAXSIZE"]
    middleware = RobotsTxtMiddleware(crawler(Spider, {"ROBOTSTXT_OBEY": True,
                                                      "ROBOTSTXT_PARSER": _RecordingParser}))
    monkeypatch.setattr(_RecordingParser, "bodies", [])  # (after Scrapy's trial of an empty one)
    robots_parsers(middleware)["127.0.0.1"] = Deferred()  # (as while it is fetched)
    body = b"User-agent: *\nDisallow: /early\n" + b"#" * (4 * cap) + b"\nDisallow: /late\n"
    response = TextResponse("http://127.0.0.1/robots.txt", body=body)
    with caplog.at_level(logging.WARNING):
        asyncio.run(middleware.parse_capped(response, "127.0.0.1",
                                            Request("http://127.0.0.1/x")))
    assert [len(b) for b in _RecordingParser.bodies] == [cap]
    parser = robots_parsers(middleware)["127.0.0.1"]
    assert not parser.allowed("http://127.0.0.1/early", "*")
    assert parser.allowed("http://127.0.0.1/late", "*")
    assert f"robots.txt of 127.0.0.1 is {len(body)} bytes: only its first {cap} are read" \
        in caplog.text


@pytest.mark.parametrize("value", [0, -1, "big", 1.5])
def test_an_invalid_robots_cap_is_refused_naming_the_setting(value: object) -> None:
    with pytest.raises(ConfigError, match="METEORSEED_ROBOTSTXT_MAXSIZE"):
        check_settings(Settings({"METEORSEED_ROBOTSTXT_MAXSIZE": value}))

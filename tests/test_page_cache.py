"""The raw-page cache: entries (encoding, adversarial entries), its SQL back ends (SQLite and a
real PostgreSQL), its bound, its writer (a failing cache never fails a crawl), its settings."""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector

from meteorseed_scrapy.cli.common import CliError
from meteorseed_scrapy.cli.site_reparse import parse_since
from meteorseed_scrapy.setting_checks import check_settings
from meteorseed_scrapy.sites import page_cache as writer_module
from meteorseed_scrapy.sites.page_cache import PageCacheConfig, PageCacheWriter, page_of
from meteorseed_scrapy.store import page_cache as cache_module
from meteorseed_scrapy.store.page_cache import (
    CachedPage,
    CacheRow,
    CorruptPage,
    PageCache,
    decode,
    encode,
    open_page_cache,
)
from meteorseed_scrapy.task.context import TASK_META_KEY
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.validators import ConfigError


def page(n: int = 1, site: str = "news", at: str = "2026-12-01T00:00:00.000000Z",
         body: bytes = b"<html><h1>Hello</h1></html>") -> CachedPage:
    return CachedPage(site_id=site, url=f"http://news.example/a/{n}", status=200,
                      headers={"Content-Type": ["text/html; charset=utf-8"]}, body=body,
                      fetched_at=at, callback="parse_detail", meta={"sites_depth": 1},
                      task={"task_id": f"t{n}", "seed_id": "s1",
                            "url": f"http://news.example/a/{n}"})


def test_an_entry_reads_back_as_the_page_it_was() -> None:
    original = page(body=bytes(range(256)) * 100)
    entry = encode(original)
    assert len(entry.data) < len(original.body)  # compressed
    assert decode(entry.data) == original
    assert entry.key == original.key == f"news:{original.key.split(':')[1]}"


@pytest.mark.parametrize(("data", "problem"), [
    (b"", "truncated"),
    (b"not zlib at all", "not a zlib stream"),
    (zlib.compress(b'{"v":1}\n<html>')[:-6], "truncated"),
    (zlib.compress(b"<html> no envelope"), "no envelope line"),
    (zlib.compress(b'{"v":1,"site_id":"x"\n<html>'), "envelope"),
    (zlib.compress(b'{"v":2}\nbody'), "not format 1"),
    (zlib.compress(b'{"v":1,"site_id":"x"}\nbody'), "envelope: no url"),
    (zlib.compress(b'[1]\nbody'), "not format 1"),
    (zlib.compress(b'\xff\xfe\n'), "envelope"),
], ids=["empty", "not-zlib", "truncated", "no-envelope", "bad-json", "other-format",
        "missing-field", "not-an-object", "not-utf8"])
def test_a_corrupted_entry_is_refused_saying_why(data: bytes, problem: str) -> None:
    with pytest.raises(CorruptPage, match=problem):
        decode(data)


def test_a_field_of_the_wrong_type_is_refused_naming_it() -> None:
    entry = encode(page())
    raw = zlib.decompress(entry.data).replace(b'"status":200', b'"status":"200"')
    with pytest.raises(CorruptPage, match="status is not a int"):
        decode(zlib.compress(raw))


def test_an_entry_inflating_past_the_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "MAX_BODY", 1000)
    with pytest.raises(CorruptPage, match="larger than 1000 bytes"):
        decode(encode(page(body=b"\0" * 5000)).data)  # (a zlib bomb in small)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.builds(lambda b, cut: zlib.compress(b)[:cut],
                                           st.binary(max_size=300), st.integers(0, 300)))
def test_any_bytes_read_back_as_a_page_or_as_corrupt(data: bytes) -> None:
    with contextlib.suppress(CorruptPage):
        decode(data)


# -- the back ends ------------------------------------------------------------------------

@pytest.fixture(params=["sqlite", "postgres", "mongomock", "mongodb"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PageCache]:
    if request.param == "mongodb":  # a real server, as the store contract runs one
        base = os.environ.get("METEORSEED_TEST_MONGO_URL")
        if not base:
            pytest.skip("no real MongoDB: set METEORSEED_TEST_MONGO_URL=mongodb://host:port")
        uri = f"{base.rstrip('/')}/meteorseed_test_{uuid.uuid4().hex[:10]}"
    else:
        uri = {"sqlite": f"sqlite:///{tmp_path}/items.db",
               "mongomock": f"mongomock://{tmp_path.name}/db"}.get(request.param) \
            or request.getfixturevalue("postgres_uri")
    opened = open_page_cache(uri, "ns1")
    yield opened
    opened.close()


def test_pages_of_a_site_since_a_time_in_order_paged(cache: PageCache) -> None:
    entries = [encode(page(n, at=f"2026-12-01T00:00:{n:02d}.000000Z")) for n in range(10)]
    cache.put(entries[5:] + entries[:5])
    cache.put([encode(page(99, site="other"))])
    got = list(cache.pages("news", "2026-12-01T00:00:03.000000Z", batch=3))
    assert [decode(e.data).url for e in got] == [f"http://news.example/a/{n}"
                                                 for n in range(3, 10)]
    assert len(list(cache.pages("news", ""))) == 10


def test_a_page_fetched_again_replaces_its_entry(cache: PageCache) -> None:
    cache.put([encode(page(1, body=b"old"))])
    cache.put([encode(page(1, body=b"new", at="2026-12-02T00:00:00.000000Z"))])
    (entry,) = cache.pages("news", "")
    assert decode(entry.data).body == b"new" and cache.usage()[0] == 1


def test_namespaces_keep_their_own_entries(cache: PageCache, tmp_path: Path) -> None:
    cache.put([encode(page(1))])
    other = type(cache).__new__(type(cache))
    other.__dict__.update(cache.__dict__)
    other.namespace = "ns2"
    assert list(other.pages("news", "")) == [] and other.usage() == (0, 0)


def test_eviction_by_age_then_oldest_first_down_to_the_byte_bound(cache: PageCache) -> None:
    entries = [encode(page(n, at=f"2026-12-01T00:00:{n:02d}.000000Z")) for n in range(10)]
    cache.put(entries)
    assert cache.evict("2026-12-01T00:00:02.000000Z", 10**9) == 2
    keep = sum(len(e.data) for e in entries[6:])
    assert cache.evict("", keep) == 4
    assert [decode(e.data).url[-1] for e in cache.pages("news", "")] == list("6789")
    assert cache.usage() == (4, keep)


# -- the writer ---------------------------------------------------------------------------

def response(status: int = 200, callback: str = "parse_detail") -> tuple[Any, Request]:
    class Spider:
        def parse_detail(self) -> None: ...
        def other(self) -> None: ...

    task = ExecTask.create(seed_id="s1", site_id="news", url="http://news.example/a/1")
    request = Request(task.url, callback=getattr(Spider(), callback),
                      meta={TASK_META_KEY: task, "sites_depth": 2, "proxy": "x"})
    return HtmlResponse(task.url, status=status, body=b"<h1>x</h1>", request=request), request


def test_what_the_writer_keeps_of_a_response() -> None:
    got = page_of(*response())
    assert got is not None and got.callback == "parse_detail" and got.meta == {"sites_depth": 2}
    assert got.task["seed_id"] == "s1" and got.site_id == "news" and got.body == b"<h1>x</h1>"
    assert page_of(*response(status=404)) is None
    assert page_of(*response(callback="other")) is None  # not the rule spider's
    warmup = Request("http://news.example/", meta={"site_id": "news"})  # (no task)
    assert page_of(HtmlResponse(warmup.url, body=b"home", request=warmup), warmup) is None


class BrokenCache(PageCache):
    shown = "broken"

    def put(self, entries: list[CacheRow]) -> None:
        raise OSError("read-only file system")

    def scan(self, *args: Any) -> list[CacheRow]:
        return []

    def usage(self) -> tuple[int, int]:
        return 0, 0

    def evict(self, older_than: str, max_bytes: int) -> int:
        return 0

    def close(self) -> None:
        pass


def stats_collector() -> MemoryStatsCollector:
    crawler: Any = type("Crawler", (), {"settings": Settings()})()
    return MemoryStatsCollector(crawler)


def config(uri: str = "sqlite:///x.db") -> PageCacheConfig:
    return PageCacheConfig(True, uri, 3600, 10**9)


def test_a_failing_cache_warns_and_the_crawl_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    stats = stats_collector()
    writer = PageCacheWriter(config(), "ns", stats, cache=BrokenCache())
    with caplog.at_level(logging.WARNING, logger=writer_module.__name__):
        for _ in range(3):
            writer.response_received(*response(), spider=None)  # type: ignore[arg-type]
        wait_for(lambda: stats.get_value("meteorseed/page_cache/errors"), timeout=10)
        writer._close()
    assert "not cached (OSError: read-only file system); the crawl goes on" in caplog.text
    assert caplog.text.count("not cached") == 1  # once a minute at most


def test_a_cache_in_a_directory_it_cannot_write_warns(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    # A file where the directory should be: unwritable even for root (the tests' user here).
    (tmp_path / "cache").write_text("not a directory")
    stats = stats_collector()
    writer = PageCacheWriter(config(f"sqlite:///{tmp_path}/cache/pages.db"), "ns", stats)
    with caplog.at_level(logging.WARNING, logger=writer_module.__name__):
        writer.response_received(*response(), spider=None)  # type: ignore[arg-type]
        wait_for(lambda: stats.get_value("meteorseed/page_cache/errors"), timeout=10)
        writer._close()
    assert "1 pages not cached (FileExistsError" in caplog.text


def test_pages_are_written_and_the_bound_applied(tmp_path: Path) -> None:
    stats = stats_collector()
    uri = f"sqlite:///{tmp_path}/items.db"
    writer = PageCacheWriter(config(uri), "ns", stats)
    writer.response_received(*response(), spider=None)  # type: ignore[arg-type]
    writer._close()
    cache = open_page_cache(uri, "ns")
    (entry,) = cache.pages("news", "")
    assert decode(entry.data).url == "http://news.example/a/1"
    assert stats.get_value("meteorseed/page_cache/stored") == 1
    cache.close()


# -- settings and options -----------------------------------------------------------------

@pytest.mark.parametrize(("name", "value"), [
    ("METEORSEED_PAGE_CACHE", "maybe"),
    ("METEORSEED_PAGE_CACHE_MAX_AGE", "soon"),
    ("METEORSEED_PAGE_CACHE_MAX_AGE", "0"),
    ("METEORSEED_PAGE_CACHE_MAX_BYTES", "0"),
    ("METEORSEED_PAGE_CACHE_MAX_BYTES", "1GB"),
    ("METEORSEED_PAGE_CACHE_URI", "redis://localhost/x"),
    ("METEORSEED_PAGE_CACHE_URI", "sqlite://"),
    ("METEORSEED_REPOSTS_ACROSS_SITES", "perhaps"),
])
def test_an_invalid_setting_is_refused_naming_it(name: str, value: str) -> None:
    values = {"METEORSEED_PAGE_CACHE": True, name: value}
    with pytest.raises(ConfigError, match=name):
        check_settings(Settings(values))


def test_a_store_that_cannot_hold_the_cache_is_refused_when_the_cache_is_on() -> None:
    with pytest.raises(ConfigError, match=r"METEORSEED_PAGE_CACHE_URI.*store.s URI unless set"):
        check_settings(Settings({"METEORSEED_PAGE_CACHE": True,
                                 "METEORSEED_STORE_URI": "redis://localhost/x"}))
    check_settings(Settings({"METEORSEED_PAGE_CACHE": True,
                             "METEORSEED_STORE_URI": "mongodb://localhost/x"}))


@pytest.mark.parametrize("given", ["yesterday", "", "2h ago", "-1h", "2026-13-01",
                                   "1e400", "0", "\x1b[2J", "9" * 400, "99999999999w",
                                   "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_since_garbage_is_refused_naming_the_option(given: str) -> None:
    with pytest.raises(CliError, match="--since"):
        parse_since(given)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60) | st.datetimes(timezones=st.timezones()).map(
    lambda moment: moment.isoformat()))
def test_since_is_a_time_or_refused_naming_the_option(given: str) -> None:
    try:
        stamp = parse_since(given)
    except CliError as exc:
        assert str(exc).startswith("--since: ")
    else:
        assert stamp == "" or (len(stamp) == 27 and stamp.endswith("Z"))


def test_since_a_duration_or_a_time() -> None:
    from datetime import datetime, timezone

    now = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)
    assert parse_since("2h", now) == "2026-12-04T10:00:00.000000Z"
    assert parse_since("2026-12-01T00:00:00Z") == "2026-12-01T00:00:00.000000Z"
    assert parse_since("2026-12-01T02:00:00+02:00") == "2026-12-01T00:00:00.000000Z"
    assert parse_since("2026-12-01") == "2026-12-01T00:00:00.000000Z"
    assert parse_since(None) == "" == parse_since("0001-01-01")


def test_the_writer_keeps_the_cache_within_its_byte_bound(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/items.db"
    one = len(encode(page_of(*response())).data)  # type: ignore[arg-type]
    # Room for three pages, not four: each page's compressed size varies by a few bytes (its
    # task's random id), so the bound leaves half a page of slack.
    bound = 3 * one + one // 2
    writer = PageCacheWriter(PageCacheConfig(True, uri, 3600, bound), "ns")
    for n in range(8):
        got, request = response()
        got = got.replace(url=f"http://news.example/a/{n}")
        writer.response_received(got, request, spider=None)  # type: ignore[arg-type]
        writer._executor.submit(lambda: None).result()  # (one group written at a time)
    writer._close()
    cache = open_page_cache(uri, "ns")
    count, size = cache.usage()
    assert size <= bound and count == 3
    assert sorted(decode(e.data).url[-1] for e in cache.pages("news", "")) == ["5", "6", "7"]
    cache.close()

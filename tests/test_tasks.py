"""ExecTask / SeedTask validation and the stream message format (``v`` + ``t``)."""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

import pytest

from meteorseed_scrapy.task.canonical import canonical_url, url_hash
from meteorseed_scrapy.task.exec_task import (
    MAX_MESSAGE_BYTES,
    MESSAGE_VERSION,
    OPTIONAL_FIELDS,
    ExecTask,
)
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError, check_url

BASE: dict[str, Any] = {
    "task_id": "t1",
    "seed_id": "s1",
    "site_id": "news",
    "url": "https://example.com/a?x=1",
}


def make(**overrides: Any) -> ExecTask:
    return ExecTask(**{**BASE, **overrides})


def full_task() -> ExecTask:
    return make(
        method="POST",
        headers={"X-Token": "abc", "Accept": ["text/html", "application/json"]},
        body='{"q": "café"}',
        callback="parse_item",
        errback="on_error",
        meta={"page": 2, "tags": ["a", "b"], "nested": {"k": None, "f": 1.5}, "ok": True},
        cb_kwargs={"category": "news"},
        priority=-3,
        retry_count=2,
        created_at=1700000000.125,
    )


def message_of(data: Any) -> dict[str, str]:
    return {"v": MESSAGE_VERSION, "t": json.dumps(data)}


# -- ExecTask validation ---------------------------------------------------------------------


def test_valid_task_keeps_its_fields() -> None:
    task = full_task()
    assert task.method == "POST"
    assert task.headers["Accept"] == ["text/html", "application/json"]
    assert task.priority == -3
    assert task.retry_count == 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"task_id": ""}, "task_id"),
        ({"task_id": None}, "task_id"),
        ({"task_id": 17}, "task_id"),
        ({"task_id": "has space"}, "task_id"),
        ({"task_id": "x" * 201}, "task_id"),
        ({"seed_id": ""}, "seed_id"),
        ({"site_id": "a\tb"}, "site_id"),
        ({"url": "ftp://example.com/file"}, "url"),
        ({"url": "https://example.com/a b"}, "url"),
        ({"url": "https://exa mple.com/"}, "url"),
        ({"url": "example.com/page"}, "url"),
        ({"url": "https://"}, "url"),
        ({"url": "http:///path-only"}, "url"),
        ({"url": ""}, "url"),
        ({"url": b"https://example.com/"}, "url"),
        ({"method": "GET /x"}, "method"),
        ({"method": ""}, "method"),
        ({"method": 1}, "method"),
        ({"headers": ["X-A", "1"]}, "headers"),
        ({"headers": {"X-Count": 3}}, "headers.X-Count"),
        ({"headers": {"X-List": ["a", 2]}}, "headers.X-List"),
        ({"headers": {"X-Bytes": b"v"}}, "headers.X-Bytes"),
        ({"body": b"raw"}, "body"),
        ({"callback": "parse-item"}, "callback"),
        ({"callback": "1parse"}, "callback"),
        ({"callback": ""}, "callback"),
        ({"callback": 5}, "callback"),
        ({"errback": "self.on_error"}, "errback"),
        ({"meta": ["a"]}, "meta"),
        ({"meta": {"when": datetime.date(2024, 1, 1)}}, "meta.when"),
        ({"meta": {"ok": 1, "bad": float("nan")}}, "meta.bad"),
        ({"meta": {"deep": {"inner": object()}}}, "meta.deep"),
        ({"cb_kwargs": {"s": {1, 2}}}, "cb_kwargs.s"),
        ({"cb_kwargs": "x=1"}, "cb_kwargs"),
        ({"priority": True}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"retry_count": -1}, "retry_count"),
        ({"retry_count": False}, "retry_count"),
        ({"created_at": "now"}, "created_at"),
        ({"created_at": True}, "created_at"),
    ],
)
def test_bad_field_is_named(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(TaskError) as info:
        make(**overrides)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert info.value.problem


def test_task_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        make(url="ftp://example.com/")


def test_check_url_names_the_given_field() -> None:
    assert check_url("HTTP://Example.com/x") == "HTTP://Example.com/x"
    with pytest.raises(TaskError) as info:
        check_url("mailto:someone@example.com", "payload.urls[3]")
    assert info.value.field == "payload.urls[3]"


def test_create_assigns_id_and_timestamp() -> None:
    a = ExecTask.create(seed_id="s1", site_id="news", url="https://example.com/")
    b = ExecTask.create(seed_id="s1", site_id="news", url="https://example.com/")
    assert a.task_id and b.task_id and a.task_id != b.task_id
    assert a.created_at > 1_600_000_000


def test_meta_with_non_string_key_is_rejected() -> None:
    with pytest.raises(TaskError) as info:
        make(meta={("a", "b"): 1})
    assert info.value.field.startswith("meta")


def test_unencodable_meta_string_gives_task_error() -> None:
    with pytest.raises(TaskError):
        make(meta={"k": "\ud800"}).to_message()


# -- message format --------------------------------------------------------------------------


def test_message_round_trip_str_fields() -> None:
    task = full_task()
    message = task.to_message()
    assert set(message) == {"v", "t"}
    assert message["v"] == MESSAGE_VERSION
    assert ExecTask.from_message(message) == task


def test_message_round_trip_bytes_fields() -> None:
    task = full_task()
    message = {k.encode(): v.encode("utf-8") for k, v in task.to_message().items()}
    decoded = ExecTask.from_message(message)
    assert decoded == task
    assert decoded.body == '{"q": "café"}'


def test_message_is_compact_json_without_defaults() -> None:
    task = make(created_at=12.5)
    data = json.loads(task.to_message()["t"])
    assert data == {**BASE, "created_at": 12.5}
    assert " " not in task.to_message()["t"]
    assert ExecTask.from_message(task.to_message()) == task


def test_each_field_set_is_written_in_its_order_and_an_empty_one_is_not() -> None:
    task = make(method="POST", headers={"A": "b"}, meta={"m": 1}, cb_kwargs={"k": 2}, body="x",
                callback="parse_x", errback="on_error", priority=-3, retry_count=1,
                lane="realtime", spider="sp", cookies=[{"name": "a", "value": "b"}],
                flags=("f",), request_class="a.B", request_attrs={"x": 1}, encoding="latin-1",
                dont_filter=False, created_at=1.5)
    data = json.loads(task.to_message()["t"])
    # (body_b64 goes without body; created_at is always last)
    assert list(data) == [*BASE, *(f for f in OPTIONAL_FIELDS if f != "body_b64"), "created_at"]
    assert data["flags"] == ["f"] and data["dont_filter"] is False and data["priority"] == -3
    empty = make(cookies=[], flags=(), headers={}, dont_filter=None, created_at=0)
    assert json.loads(empty.to_message()["t"]) == {**BASE, "created_at": 0}


def test_message_keeps_non_ascii_readable() -> None:
    task = make(url="https://example.com/café", meta={"title": "日本"})
    raw = task.to_message()["t"]
    assert "日本" in raw
    assert ExecTask.from_message(task.to_message()) == task


@pytest.mark.parametrize("version", ["2", "", "0"])
def test_unknown_version_is_rejected(version: str) -> None:
    message = {**make().to_message(), "v": version}
    with pytest.raises(TaskError) as info:
        ExecTask.from_message(message)
    assert info.value.field == "v"


def test_missing_version_is_rejected() -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.from_message({"t": make().to_message()["t"]})
    assert info.value.field == "v"


def test_missing_payload_is_rejected() -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.from_message({"v": MESSAGE_VERSION})
    assert info.value.field == "t"


@pytest.mark.parametrize("raw", ["{not json", "", '{"task_id": "a",'])
def test_bad_json_is_rejected(raw: str) -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.from_message({"v": MESSAGE_VERSION, "t": raw})
    assert info.value.field == "t"
    assert "JSON" in info.value.problem


@pytest.mark.parametrize("data", [["a"], "task", 5, None])
def test_non_object_payload_is_rejected(data: Any) -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.from_message(message_of(data))
    assert info.value.field == "task"


@pytest.mark.parametrize("missing", ["task_id", "seed_id", "site_id", "url"])
def test_missing_field_is_named(missing: str) -> None:
    data = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(TaskError) as info:
        ExecTask.from_message(message_of(data))
    assert info.value.field == missing
    assert "missing" in info.value.problem


def test_unknown_field_is_named() -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.from_message(message_of({**BASE, "zz_extra": 1, "pickle": "x"}))
    assert info.value.field == "pickle"


def test_bad_value_inside_message_is_named() -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.from_message(message_of({**BASE, "retry_count": -2}))
    assert info.value.field == "retry_count"
    with pytest.raises(TaskError) as info:
        ExecTask.from_message(message_of({**BASE, "meta": {"x": float("inf")}}))
    assert info.value.field == "meta.x"


def _padded(nbytes: int) -> ExecTask:
    """A task whose encoded message is exactly ``nbytes`` bytes long."""
    base = len(make(meta={"pad": ""}).to_message()["t"].encode("utf-8"))
    task = make(meta={"pad": "x" * (nbytes - base)})
    encoded = json.dumps(task.to_dict(), separators=(",", ":"), ensure_ascii=False)
    assert len(encoded.encode("utf-8")) == nbytes
    return task


def test_message_at_size_bound_is_accepted() -> None:
    task = _padded(MAX_MESSAGE_BYTES)
    assert ExecTask.from_message(task.to_message()) == task


def test_message_over_size_bound_is_rejected() -> None:
    with pytest.raises(TaskError) as info:
        _padded(MAX_MESSAGE_BYTES + 1).to_message()
    assert info.value.field == "task"
    assert str(MAX_MESSAGE_BYTES) in info.value.problem


def test_size_bound_counts_utf8_bytes_not_characters() -> None:
    # 2-byte characters: fewer characters than the bound, more bytes.
    task = make(meta={"pad": "é" * (MAX_MESSAGE_BYTES // 2 + 10)})
    assert len(json.dumps(task.to_dict(), ensure_ascii=False)) < MAX_MESSAGE_BYTES
    with pytest.raises(TaskError) as info:
        task.to_message()
    assert info.value.field == "task"


def test_oversized_incoming_message_is_rejected() -> None:
    raw = json.dumps({**BASE, "meta": {"pad": "x" * MAX_MESSAGE_BYTES}})
    with pytest.raises(TaskError) as info:
        ExecTask.from_message({"v": MESSAGE_VERSION, "t": raw})
    assert info.value.field == "task"


# -- canonical URL and fingerprint -------------------------------------------------------------


def test_canonical_url_sorts_query_and_drops_fragment() -> None:
    assert canonical_url("https://example.com/p?b=2&a=1#top") == "https://example.com/p?a=1&b=2"


def test_fingerprint_ignores_query_order_and_fragment() -> None:
    fp = url_hash("https://example.com/p?a=1&b=2")
    assert url_hash("https://example.com/p?b=2&a=1") == fp
    assert url_hash("https://example.com/p?a=1&b=2#section-3") == fp
    assert url_hash("https://example.com/p?a=1&b=2") == fp  # stable across calls


def test_fingerprint_is_sha256_hex_of_canonical_url() -> None:
    expected = hashlib.sha256(b"https://example.com/p?a=1&b=2").hexdigest()
    assert url_hash("https://example.com/p?b=2&a=1#x") == expected


def test_fingerprint_tells_different_urls_apart() -> None:
    fp = url_hash("https://example.com/p?a=1")
    assert url_hash("https://example.com/p?a=2") != fp
    assert url_hash("https://example.com/q?a=1") != fp
    assert url_hash("https://example.org/p?a=1") != fp


def test_task_canonical_url_property() -> None:
    task = make(url="https://example.com/p?b=2&a=1#frag")
    assert task.canonical_url == "https://example.com/p?a=1&b=2"


# -- SeedTask --------------------------------------------------------------------------------

SEED: dict[str, Any] = {
    "seed_id": "s1",
    "site_id": "news",
    "task_type": "url_list",
    "payload": {"urls": ["https://example.com/"]},
}


def test_seed_from_dict_defaults() -> None:
    seed = SeedTask.from_dict(dict(SEED))
    assert seed.priority == 0
    assert seed.callback is None
    assert dict(seed.meta) == {}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"seed_id": ""}, "seed_id"),
        ({"site_id": "a b"}, "site_id"),
        ({"task_type": "rss"}, "task_type"),
        ({"payload": ["https://example.com/"]}, "payload"),
        ({"priority": True}, "priority"),
        ({"priority": "high"}, "priority"),
        ({"callback": "parse item"}, "callback"),
        ({"parse_rule": 3}, "parse_rule"),
        ({"meta": "x"}, "meta"),
    ],
)
def test_bad_seed_field_is_named(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(TaskError) as info:
        SeedTask.from_dict({**SEED, **overrides})
    assert info.value.field == field


def test_seed_meta_not_json_safe_is_rejected() -> None:
    with pytest.raises(TaskError) as info:
        SeedTask.from_dict({**SEED, "meta": {"when": datetime.date(2024, 1, 1)}})
    assert info.value.field.startswith("meta")


@pytest.mark.parametrize("missing", ["seed_id", "site_id", "task_type", "payload"])
def test_seed_missing_field_is_named(missing: str) -> None:
    with pytest.raises(TaskError) as info:
        SeedTask.from_dict({k: v for k, v in SEED.items() if k != missing})
    assert info.value.field == missing


def test_seed_unknown_field_and_non_object() -> None:
    with pytest.raises(TaskError) as info:
        SeedTask.from_dict({**SEED, "urls": []})
    assert info.value.field == "urls"
    with pytest.raises(TaskError) as info:
        SeedTask.from_dict([SEED])
    assert info.value.field == "seed"


def test_seed_exec_task_inherits_seed_fields() -> None:
    seed = SeedTask.from_dict(
        {**SEED, "priority": 4, "callback": "parse_article", "parse_rule": "article",
         "meta": {"lang": "en"}}
    )
    task = seed.exec_task("https://example.com/x", retry_count=1)
    assert (task.seed_id, task.site_id, task.url) == ("s1", "news", "https://example.com/x")
    assert task.callback == "parse_article"
    assert task.priority == 4
    assert task.retry_count == 1
    assert dict(task.meta) == {"lang": "en", "parse_rule": "article"}
    assert dict(seed.meta) == {"lang": "en"}  # the seed's own meta is not modified


# -- canonical_url's fast path gives w3lib's results exactly ------------------------------------

_HOSTS = ["example.com", "news.example.com", "Example.COM", "a-b.c0.io", "xn--nxasmq6b.com",
          "bücher.de", "münchen.example", "127.0.0.1", "[::1]", "a..b", "-a.b", "a-.b", "a--b.c",
          "a.b.", "x" * 64 + ".com", "1a.2b", "a.123", "user:pw@a.b", "a.b:80", "a.b:443",
          "a.b:0", "EXAMPLE.com", "例え.テスト"]
_PATH_PARTS = ["", "/", "/a", "/A", "/a/b", "/a.html", "/.", "/..", "/./", "/../x", "/a/./b",
               "/a/../b", "/.well-known/x", "//a", "/a~b_c-d.e", "/%7E", "/%7e", "/%2F", "/%2f",
               "/a%20b", "/a b", "/é", "/%C3%A9", "/a;p=1", "/a:b", "/a@b", "/a+b", "/a!$'()*,",
               "/a%", "/%zz", "/\u00a0", "/a\\b", "/a|b", "/a{b}", "/a^b", "/a`b", "/..a", "/a.."]
_QUERIES = ["", "?", "?a=1", "?ref=list", "?a=1&b=2", "?b=2&a=1", "?a=2&a=1", "?a=1&a=2",
            "?a", "?a=", "?=a", "?a=1&&b=2", "?a=1&", "?&a=1", "?a=%7E", "?a=%7e", "?a=b+c",
            "?a=b%20c", "?a=b c", "?q=é", "?q=%C3%A9", "?a=1;b=2", "?a=1=2", "?B=1&a=1",
            "?a.b=1&a_b=2", "?a-b=1&a.b=2", "?a~=1&a=2", "?x=%2F", "?x=/", "?x=?", "?x=%",
            "?a=1&b=2&c=3", "?c=3&b=2&a=1", "?aa=1&a=2", "?a=10&a=9", "?a=&a=1"]
_FRAGMENTS = ["", "#", "#top", "#a=1", "#é"]


def _varied_urls() -> list[str]:
    import random

    rng = random.Random(20261130)
    urls = []
    for scheme in ("http", "https", "HTTP", "Https"):
        for host in _HOSTS:
            urls.append(f"{scheme}://{host}")
            urls.append(f"{scheme}://{host}/p?a=1")
    for _ in range(30_000):
        scheme = rng.choice(("http", "https", "https", "HTTPS"))
        host = rng.choice(_HOSTS[:4]) if rng.random() < 0.7 else rng.choice(_HOSTS)
        path = "".join(rng.choice(_PATH_PARTS) for _ in range(rng.randint(0, 3)))
        if path and not path.startswith("/"):
            path = "/" + path
        query = rng.choice(_QUERIES) if rng.random() < 0.6 else ""
        if rng.random() < 0.3:
            query += "&" + rng.choice(_QUERIES).lstrip("?")
        fragment = rng.choice(_FRAGMENTS) if rng.random() < 0.2 else ""
        urls.append(f"{scheme}://{host}{path}{query}{fragment}")
    # Near the fast path's edges: unreserved characters and dots in every place.
    chars = "abcXYZ019._~-"
    for _ in range(20_000):
        word = lambda: "".join(rng.choice(chars) for _ in range(rng.randint(0, 4)))  # noqa: E731
        host = ".".join(rng.choice(("a", "b1", "c-d", "1e", "f", "0")) for _ in range(
            rng.randint(1, 3)))
        path = "".join("/" + word() for _ in range(rng.randint(1, 4)))
        pairs = [f"{word()}={word()}" for _ in range(rng.randint(0, 3))]
        query = ("?" + "&".join(pairs)) if pairs else ""
        urls.append(f"{rng.choice(('http', 'https'))}://{host}{path}{query}")
    return urls


def test_canonical_url_matches_w3lib_over_varied_urls() -> None:
    from w3lib.url import canonicalize_url

    from meteorseed_scrapy.task.canonical import _is_canonical

    fast = 0
    for url in _varied_urls():
        try:
            expected: str | None = canonicalize_url(url, keep_fragments=False)
        except ValueError:
            expected = None
        if expected is None:
            assert not _is_canonical(url), url
            with pytest.raises(ValueError):
                canonical_url(url)
            continue
        assert canonical_url(url) == expected, url
        if _is_canonical(url):
            fast += 1
            assert expected == url, url
    assert fast > 3_000  # the fast path is really exercised, not only the fallback


def test_exec_task_factory_tasks_have_their_own_canonical_url(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A task caches its canonical URL; the fast factory copies its template's fields, and must
    not copy the template's cached one with them."""
    exec_json = SeedTask.exec_json

    def primed(seed: SeedTask) -> Any:
        parts = exec_json(seed)
        assert parts is not None
        assert parts.template.canonical_url == "http://template.invalid/"  # now cached on it
        return parts

    monkeypatch.setattr(SeedTask, "exec_json", primed)
    make = SeedTask.from_dict(SEED).exec_task_factory()
    assert make is not None
    for url in ("https://example.com/b?z=1&a=2#f", "http://x.y/", "https://example.com/a"):
        task = make(url)
        assert task.canonical_url == canonical_url(url)
        decoded = ExecTask.from_message(task.to_message())
        assert decoded.canonical_url == task.canonical_url


def test_exec_task_factory_gives_what_exec_task_gives() -> None:
    import uuid

    seed = SeedTask.from_dict(
        {**SEED, "priority": 2, "callback": "parse_item", "parse_rule": "r",
         "meta": {"recrawl_after": 60, "lang": "é\"\\", "n": [1, 2.5, None]}}
    )
    make = seed.exec_task_factory()
    assert make is not None
    for url in ("https://example.com/a?b=1", 'https://example.com/é"\\\u2603', "http://x.y/"):
        fast, slow = make(url), seed.exec_task(url)
        assert uuid.UUID(fast.task_id).version == 4 and uuid.UUID(fast.task_id).hex == fast.task_id
        assert fast == ExecTask(**{**slow.__dict__, "task_id": fast.task_id,
                                   "created_at": fast.created_at})
        assert fast.to_message()["t"] == json.dumps(
            fast.to_dict(), separators=(",", ":"), ensure_ascii=False)
    with pytest.raises(TaskError) as fast_error:
        make("ftp://example.com/")
    with pytest.raises(TaskError) as slow_error:
        seed.exec_task("ftp://example.com/")
    assert str(fast_error.value) == str(slow_error.value)
    bad = SeedTask(seed_id="s", site_id="x", task_type="url_list", payload={}, meta={1: "a"})
    assert bad.exec_task_factory() is None  # seed-level problems: the slow path names them

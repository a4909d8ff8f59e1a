"""Migration against hostile scrapy-redis entries (real Redis): each bad entry is reported with
its position and reason, left in place, counted; the migration goes on with the next one."""

from __future__ import annotations

import json
import pickle
import struct
import uuid
from collections import Counter
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.migrate.scrapy_redis import (
    MAX_REASON,
)
from meteorseed_scrapy.migrate.unpickle import MAX_DEPTH, MAX_OPCODES, MAX_PAYLOAD_BYTES, MAX_VALUES
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.redis_server import RedisServer
from tests.test_migrate import run, source_for

URL = "https://shop.example/p"


def _u(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE


def _request_with_meta(meta_value_ops: bytes) -> bytes:
    """A protocol-4 pickle of ``{"url": URL, "meta": {"x": <value built by the opcodes>}}``,
    written opcode by opcode: pickle.dumps itself cannot build these values."""
    return (b"\x80\x04}(" + _u("url") + _u(URL) + _u("meta") + b"}" + _u("x")
            + meta_value_ops + b"su.")


def billion_laughs(levels: int = 9) -> bytes:
    """Each list holds ten references to the one below: 10**levels strings from ~300 bytes."""
    ops = _u("lol" * 10) + b"\x940"  # MEMOIZE (as 0), POP
    for level in range(levels):
        ops += b"(" + (b"h" + bytes([level])) * 10 + b"l\x940"  # MARK, 10 x BINGET, LIST
    return _request_with_meta(ops + b"h" + bytes([levels]))


NASTY: dict[str, tuple[bytes, str]] = {
    "not_a_dict": (pickle.dumps([URL], protocol=4), "holds a list, not a request dict"),
    "wrong_field_type": (pickle.dumps({"url": 5}, protocol=4), "url: expected text"),
    "too_deep": (_request_with_meta(b"]" * 5000 + b"a" * 4999),
                 f"nested deeper than {MAX_DEPTH} levels"),
    "billion_laughs": (billion_laughs(), f"more than {MAX_VALUES} values"),
    "huge": (pickle.dumps({"url": URL, "body": b"x" * (MAX_PAYLOAD_BYTES + 1)}, protocol=4),
             f"larger than {MAX_PAYLOAD_BYTES}"),
    "too_many_objects": (pickle.dumps({"url": URL, "meta": {"n": list(range(MAX_OPCODES))}},
                                      protocol=4), f"more than {MAX_OPCODES} opcodes"),
    "memo_bomb": (b"\x80\x04]r" + struct.pack("<I", 2**31) + b".", "memo index 2147483648"),
    "truncated": (pickle.dumps({"url": URL, "meta": {"a": "b" * 50}}, protocol=4)[:-9],
                  "not a readable pickle"),
    "forbidden_global": (b"cos\nsystem\n(S'echo pwned'\ntR.", "'os.system'"),
    "json_too_deep": (b'{"url": "' + URL.encode() + b'", "meta": ' + b"[" * 100_000
                      + b"]" * 100_000 + b"}", f"nested deeper than {MAX_DEPTH} levels"),
    "non_ascii_method": (pickle.dumps({"url": URL, "method": "G\u0130T"}, protocol=4),
                         "not an HTTP method"),
    # (under the entry's cap, over a task message's: refused by the writer, for this entry)
    "too_large_a_task": (pickle.dumps({"url": URL, "method": "POST", "body": b"x" * 300_000},
                                      protocol=4), "task: encodes to more than 262144 bytes"),
    "unknown_field": (pickle.dumps({"url": URL, "proxy": "http://p"}, protocol=4),
                      "proxy: is not a field of a request dict"),
    "dont_filter_not_a_flag": (pickle.dumps({"url": URL, "dont_filter": [None]}, protocol=4),
                               "dont_filter: must be true or false"),
}






def stream_urls(client: redis.Redis, namespace: str) -> list[str]:
    entries: Any = [e for s in KeyLayout(namespace).streams for e in client.xrange(s)]
    return [ExecTask.from_message(fields).url for _, fields in entries]


def good(i: int) -> bytes:
    return pickle.dumps({"url": f"{URL}/{i}", "method": "GET", "meta": {"i": i}}, protocol=4)


def test_the_laughs_pickle_is_small_and_expands() -> None:
    payload = billion_laughs()
    assert len(payload) < 1000
    value = pickle.loads(payload)["meta"]["x"]
    assert len(value) == 10 and value[0] is value[1]  # shared, ten per level, nine levels


@pytest.mark.parametrize("move", [True, False])
def test_each_nasty_entry_is_reported_and_left_in_place(
        move: bool, sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    raw = redis.Redis.from_url(redis_url)
    key = f"{namespace}:requests"
    names = list(NASTY)
    # FifoQueue order: LPUSH, served from the tail; a good entry between any two bad ones.
    served = [e for i, name in enumerate(names) for e in (good(i), NASTY[name][0])]
    raw.lpush(key, *served)
    summary, rejections = run(redis_url, namespace, source_for(namespace), move=move,
                              batch_size=3)

    assert (summary.requests, summary.rejected) == (2 * len(names), len(names))
    assert summary.enqueued == len(names)
    by_position = {r.position: r for r in rejections}
    for i, name in enumerate(names):
        rejection = by_position[2 * i + 1]
        assert rejection.key == key
        assert NASTY[name][1] in rejection.reason, (name, rejection.reason)
        assert str(rejection).startswith(f"{key} entry {2 * i + 1}: ")
    expected_left = [NASTY[n][0] for n in names] if move else served
    assert raw.lrange(key, 0, -1)[::-1] == expected_left
    assert sorted(stream_urls(sync_redis, namespace)) == sorted(
        f"{URL}/{i}" for i in range(len(names)))
    raw.close()


def test_reasons_escape_what_the_entry_says(redis_url: str, namespace: str) -> None:
    raw = redis.Redis.from_url(redis_url)
    clear_screen = b"cos\x1b[2J\nsystem\n(S'x'\ntR."
    long_class = pickle.dumps({"url": URL, "_class": "a\x1b[2J" * 500}, protocol=4)
    raw.lpush(f"{namespace}:requests", clear_screen, long_class)
    _, rejections = run(redis_url, namespace, source_for(namespace))

    assert len(rejections) == 2
    for rejection in rejections:
        assert "\x1b" not in str(rejection) and "\\x1b" in rejection.reason
        assert len(rejection.reason) <= MAX_REASON + 3
    raw.close()


def test_start_urls_bad_score_bad_json_and_wrong_key_type(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    raw = redis.Redis.from_url(redis_url)
    start = f"{namespace}:start_urls"
    raw.zadd(start, {
        f"{URL}/ok": 5,
        f"{URL}/inf": float("inf"),
        json.dumps({"url": f"{URL}/nomethod", "method": None}): 1,
        json.dumps({"url": f"{URL}/meta", "meta": [1]}): 2,
        '{"url": "x", "a": ' + "[" * 100_000 + "]" * 100_000 + "}": 3,
    })
    raw.hset(f"{namespace}:requests", "not", "a queue")  # a hash where a queue should be
    summary, rejections = run(redis_url, namespace, source_for(namespace), move=True)

    reasons = sorted(str(r) for r in rejections)
    assert summary.rejected == 5 and summary.enqueued == 1, reasons
    assert f"{namespace}:requests: a Redis hash, not a list, set or sorted set" in reasons[0]
    assert any("score inf is not a finite priority" in r for r in reasons)
    assert any("method: expected text, got NoneType" in r for r in reasons)
    assert any("meta is not an object" in r for r in reasons)
    assert any("nested" in r for r in reasons)
    assert raw.zcard(start) == 4 and raw.hget(f"{namespace}:requests", "not") == b"a queue"
    assert stream_urls(sync_redis, namespace) == [f"{URL}/ok"]
    raw.close()


def test_a_huge_entry_is_never_read(redis_url: str, namespace: str) -> None:
    raw = redis.Redis.from_url(redis_url)
    huge = b"\x80\x04" + b"N" * (5 * MAX_PAYLOAD_BYTES)
    raw.sadd(f"{namespace}:start_urls", huge, f"{URL}/1")
    summary, rejections = run(redis_url, namespace, source_for(namespace), move=True)

    assert (summary.rejected, summary.enqueued) == (1, 1)
    assert rejections[0].reason == (f"entry is {len(huge)} bytes, larger than "
                                    f"{MAX_PAYLOAD_BYTES}")
    assert raw.smembers(f"{namespace}:start_urls") == {huge}
    raw.close()


# -- every entry, whatever its bytes, is migrated or reported and left in place ---------------

_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4)
    | st.tuples(inner, inner),
    max_leaves=12,
)
_request = st.fixed_dictionaries(
    {"url": st.sampled_from([f"{URL}/a", f"{URL}/b", "ftp://x", "", "https://\x1b[2J.example/"])
     | st.text(max_size=30)},
    optional={name: _plain | st.sampled_from([
        "GET", "POST", "parse", b"x", "cp1251", "scrapy.http.request.json_request.JsonRequest",
        "scrapy.http.request.form.FormRequest", [{"name": "a", "value": 1}], ["flag"]])
        for name in ("method", "headers", "body", "meta", "cb_kwargs", "priority", "callback",
                     "errback", "_class", "cookies", "flags", "encoding", "dont_filter",
                     "dumps_kwargs")},
)
_pickled = st.tuples(_request, st.integers(0, 5)).map(lambda d: pickle.dumps(d[0], d[1]))
_entry = st.one_of(
    st.binary(max_size=200),
    _pickled,
    st.tuples(_pickled, st.integers(1, 40)).map(lambda p: p[0][:-p[1]]),  # truncated
    _pickled.map(lambda p: bytes(b ^ 0x20 if i == len(p) // 2 else b for i, b in enumerate(p))),
    _request.map(lambda d: json.dumps(d, default=repr).encode()),
)
_start_url = st.one_of(
    st.binary(max_size=100),
    st.sampled_from([f"{URL}/s", "not a url", "{}", '{"url": 1}', '{"url": "' + URL + '"}']
                    ).map(str.encode),
    _request.map(lambda d: json.dumps(d, default=repr).encode()),
)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(entries=st.lists(_entry, max_size=8), starts=st.lists(_start_url, max_size=5),
       batch=st.integers(1, 4), move=st.booleans())
def test_any_bytes_are_migrated_or_reported_and_left(
        redis_server: RedisServer, entries: list[bytes], starts: list[bytes], batch: int,
        move: bool) -> None:
    namespace = f"h{uuid.uuid4().hex[:12]}"
    raw = redis.Redis.from_url(redis_server.url)
    queue, start = f"{namespace}:requests", f"{namespace}:start_urls"
    try:
        if entries:
            raw.lpush(queue, *entries)  # served from the tail: position i is entries[i]
        if starts:
            raw.rpush(start, *starts)  # served from the head: position i is starts[i]
        summary, rejections = run(redis_server.url, namespace, source_for(namespace),
                                  move=move, batch_size=batch)

        assert (summary.requests, summary.start_urls) == (len(entries), len(starts))
        assert summary.rejected == len(rejections)
        for r in rejections:
            assert not r.reason.startswith("cannot be converted"), r  # nothing unforeseen
            assert r.reason.isprintable() and len(r.reason) <= MAX_REASON + 3
        rejected = {(r.key, r.position) for r in rejections}
        bad = [e for i, e in enumerate(entries) if (queue, i) in rejected]
        bad_starts = [e for i, e in enumerate(starts) if (start, i) in rejected]
        migrated = len(entries) + len(starts) - len(rejections)
        assert summary.enqueued + summary.duplicates == migrated
        assert len(stream_urls(raw, namespace)) == summary.enqueued
        if move:
            assert Counter(raw.lrange(queue, 0, -1)) == Counter(bad)
            assert Counter(raw.lrange(start, 0, -1)) == Counter(bad_starts)
            assert summary.removed == migrated
        else:
            assert raw.lrange(queue, 0, -1) == entries[::-1]
            assert raw.lrange(start, 0, -1) == starts
    finally:
        keys = list(raw.scan_iter(f"{namespace}:*"))
        if keys:
            raw.delete(*keys)
        raw.close()

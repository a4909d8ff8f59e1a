"""seed-expand's fast path (URLs already canonical: no ExecTask per URL, ids made in bulk)
against the general path: the same task JSON, canonical URL, fingerprint and errors for any
URL, whichever way it goes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from w3lib.url import canonicalize_url

from meteorseed_scrapy.queue.enqueue.batch_pipeline import NotSent, ScriptOrder
from meteorseed_scrapy.queue.enqueue.writer import TaskEncoder, TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.expand import expand_lines
from meteorseed_scrapy.seeding.expand_types import ExpandOptions, ExpandSummary
from meteorseed_scrapy.seeding.seed_urls import (
    MAX_URL_BYTES,
    UrlError,
    expand,
    expand_checked,
)
from meteorseed_scrapy.task.canonical import AS_IS_MAX_LEN, AS_IS_URL, _is_canonical
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.ids import task_ids
from meteorseed_scrapy.task.seed_task import SeedTask

SEEDS = [
    {"seed_id": "s1", "site_id": "news", "task_type": "url_list"},
    {"seed_id": "s-é\"\\", "site_id": "site_2", "task_type": "url_list", "priority": 3,
     "callback": "parse_item", "parse_rule": "r1", "lane": "scheduled",
     "meta": {"recrawl_after": 60, "lang": "é\"\\\u2028", "n": [1, 2.5, None], "t": True}},
    {"seed_id": "s3", "site_id": "news", "task_type": "url_list",
     "payload_recrawl": 86400},
]

_LABELS = st.sampled_from(["a", "b1", "c-d", "1e", "news", "Example", "EXAMPLE", "x--y", "-a",
                           "a-", "xn--nxasmq6b", "bücher", "例え", "", "0", "x" * 63, "x" * 64])
_HOSTS = st.one_of(
    st.lists(_LABELS, min_size=1, max_size=4).map(".".join),
    st.sampled_from(["127.0.0.1", "[::1]", "[::1", "a.b:80", "a.b:8080", "a.b:0", "a.b:99999",
                     "a.b:x", "user:pw@a.b", "a.b.", ".a.b", "a..b", "a.123", "A.B.C"]),
)
_SEGMENTS = st.sampled_from(["a", "A", "a.html", ".", "..", ".well-known", "a~b_c-d.e", "%7E",
                             "%7e", "%2F", "a b", "a\tb", "é", "%C3%A9", "a;p=1", "a:b", "a@b",
                             "a+b", "a%", "%zz", "\u00a0", "a\\b", "a|b", "a\"b", "--", "a--b",
                             "", "\x00", "\x7f", "\ud800"])
_QUERIES = st.one_of(
    st.just(""),
    st.lists(st.tuples(st.sampled_from(["a", "b", "ref", "A", "a.b", "a_b", "~", "é", "a b"]),
                       st.sampled_from(["", "1", "2", "list", "x-y", "%7E", "/", "?", "é"])),
             max_size=3).map(lambda pairs: "?" + "&".join(f"{k}={v}" for k, v in pairs)),
    st.sampled_from(["?", "?a", "?=a", "?a=1&&b=2", "?a=1=2"]),
)
_URLS = st.one_of(
    st.builds(lambda scheme, host, path, query, fragment: f"{scheme}://{host}{path}{query}"
                                                           f"{fragment}",
              st.sampled_from(["http", "https", "HTTP", "Https", "ftp", "http:/", ""]),
              _HOSTS,
              st.lists(_SEGMENTS, max_size=4).map(lambda s: "".join("/" + p for p in s)),
              _QUERIES,
              st.sampled_from(["", "", "#", "#top"])),
    # Near the length limits: AS_IS_MAX_LEN (canonical as-is unchecked) and MAX_URL_BYTES.
    st.builds(lambda host, n, tail: f"https://{host}/{'a' * n}{tail}",
              st.sampled_from(["a.example", "x" * 63 + "." + "y" * 63 + "." + "z" * 63 + "." +
                               "w" * 60, "b.example", "É.example"]),
              st.sampled_from([0, 200, AS_IS_MAX_LEN - 20, AS_IS_MAX_LEN - 19, 2000, 2020,
                               MAX_URL_BYTES - 19, MAX_URL_BYTES - 18, 3000]),
              st.sampled_from(["", "é", "?a=1", "/./x"])),
    st.text(max_size=40),
    st.text(alphabet="htps:/.?&=#%-_~abcXYZ019é ", max_size=40),
)
_VALUES = st.one_of(_URLS, _URLS, _URLS, st.none(), st.integers(), st.lists(st.none(),
                    max_size=1), st.booleans())


def make_seed(urls: list[Any], fields: dict[str, Any]) -> SeedTask:
    fields = dict(fields)
    payload: dict[str, Any] = {"urls": urls}
    if "payload_recrawl" in fields:
        payload["recrawl_after"] = fields.pop("payload_recrawl")
    return SeedTask(**fields, payload=payload)


def writer() -> TaskWriter:
    return TaskWriter(aioredis.Redis(), KeyLayout("t"))  # (never connects: encodes only)


def check_same(fields: dict[str, Any], urls: list[Any]) -> int:
    """Compare both paths over ``urls``; the number of URLs that took the fast path."""
    seed = make_seed(urls, fields)
    before = time.time()
    fast = list(expand_checked(seed, as_template=lambda template: True))
    after = time.time()
    slow = list(expand(seed))
    assert len(fast) == len(slow) == len(urls)
    general = writer()
    fast_ones = 0
    for got, want in zip(fast, slow, strict=True):
        if isinstance(want, UrlError):
            assert got == want  # the same position and reason
            continue
        assert not isinstance(got, UrlError), (got, want)
        task, canonical, payload, url = got
        assert url == want.url
        assert canonical == canonicalize_url(want.url, keep_fragments=False)
        data = json.loads(payload)
        assert uuid.UUID(data["task_id"]).version == 4
        assert uuid.UUID(data["task_id"]).hex == data["task_id"]
        assert round(before, 3) - 0.001 <= data["created_at"] <= round(after, 3) + 0.001
        # The very text the general path encodes for that task id and time.
        expected = dataclasses.replace(want, task_id=data["task_id"],
                                       created_at=data["created_at"])
        assert payload == expected.to_message()["t"]
        assert ExecTask.from_message({"v": "1", "t": payload}) == expected
        if task.url != url:  # the template: the fast path
            fast_ones += 1
            assert task.url == "http://template.invalid/"
            assert AS_IS_URL.fullmatch(url)
            # Its seed-level fields, which the writer reads, are the task's.
            assert dataclasses.replace(task, url=url, task_id=expected.task_id,
                                       created_at=expected.created_at) == expected
        else:
            assert task == expected
        # The dedup key and everything else the writer sends for it.
        encode = general.encoder(task).encode
        assert encode(task, canonical, payload) == general.encode(expected, True, canonical)
        assert encode(task, canonical, payload).fingerprint == general.fingerprint(expected)
    return fast_ones


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SEEDS), st.lists(_VALUES, max_size=12))
def test_fast_path_gives_what_the_general_path_gives(fields: dict[str, Any],
                                                     urls: list[Any]) -> None:
    check_same(fields, urls)


@settings(max_examples=300, deadline=None)
@given(_URLS)
def test_the_inline_as_is_test_implies_w3lib_leaves_the_url_as_it_is(url: str) -> None:
    # What seed_urls._expand_as_is checks per URL before taking a URL as its canonical form.
    if (len(url) <= AS_IS_MAX_LEN and AS_IS_URL.fullmatch(url) and "&" not in url
            and "/." not in url and "--" not in url):
        assert _is_canonical(url)
        assert canonicalize_url(url, keep_fragments=False) == url


def test_named_cases_take_the_way_they_must() -> None:
    urls = ["https://news.example.com/article/1?ref=list",  # fast, canonical as is
            "https://news.example.com/a?b=2&a=1",  # fast, canonical sorted by w3lib
            "https://News.Example.com/a",  # general: uppercase host
            "https://news.example.com:8080/a",  # general: a port
            "https://bücher.de/é",  # general: unicode
            "http://news.example.com/a--b/./c",  # fast, canonicalised
            "https://" + "a" * 300 + ".com/x",  # general: a label over 63 characters
            "https://a.example/" + "a" * (MAX_URL_BYTES - 18),  # fast, the longest there is
            "https://a.example/" + "a" * (MAX_URL_BYTES - 17),  # too long
            "ftp://a.example/", "https://a b/", "", None, 7, "https://[::1/"]
    for fields in SEEDS:
        assert check_same(fields, urls) == 4
    assert check_same(SEEDS[0], [f"https://a.example/{i}" for i in range(500)]) == 500


def test_a_seed_whose_fields_fail_rejects_each_url_as_before() -> None:
    seed = SeedTask(seed_id="s", site_id="x", task_type="url_list",
                    payload={"urls": ["https://a.example/", "nope"]}, meta={1: "a"})
    fast = list(expand_checked(seed, as_template=lambda template: True))
    slow = list(expand(seed))
    assert fast == slow
    assert all(isinstance(item, UrlError) and "meta" in item.reason for item in fast)


def test_task_ids_are_fresh_version_4_uuids() -> None:
    text = task_ids(1000)
    ids = [text[i:i + 32] for i in range(0, len(text), 32)]
    assert len(ids) == len(set(ids)) == 1000
    for each in ids:
        parsed = uuid.UUID(each)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, each)


# -- the engine: the fast way and the general way put the same tasks in Redis ---------------

class GeneralWriter(TaskWriter):
    """A writer whose encoder reads each task: the engine takes the general way."""

    def encoder(self, task: ExecTask, dedup: bool = True) -> TaskEncoder:
        return TaskEncoder(lambda each, canonical, _: self.encode(each, dedup, canonical), True)


def run(redis_url: str, namespace: str, lines: list[str], general: bool) -> list[str]:
    errors: list[str] = []

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            cls = GeneralWriter if general else TaskWriter
            await expand_lines(lines, cls(client, KeyLayout(namespace)),
                               ExpandOptions(batch_size=7),
                               on_error=lambda e: errors.append(str(e)))
        finally:
            await client.aclose()

    asyncio.run(main())
    return errors


def stream_tasks(sync_redis: redis.Redis, namespace: str) -> list[dict[str, Any]]:
    keys = KeyLayout(namespace)
    out = []
    for stream in keys.streams:
        for _, fields in sync_redis.xrange(stream):  # type: ignore[union-attr]
            data = json.loads(fields["t"])
            data.pop("task_id"), data.pop("created_at")
            out.append({"stream": stream, **data})
    return out


def test_the_engine_puts_the_same_tasks_either_way(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    urls: list[Any] = [f"https://a.example/{i % 23}?p={i % 5}" for i in range(60)]
    urls += ["https://A.example/1?p=1", "https://a.example/1?p=1#x", "nope", None,
             "https://a.example/b?z=1&a=2", "https://a.example/b?a=2&z=1", "https://é.example/"]
    lines = [json.dumps({**{k: v for k, v in fields.items() if k != "payload_recrawl"},
                         "payload": {"urls": urls}}) for fields in SEEDS]
    fast_errors = run(redis_url, namespace, lines, general=False)
    general_errors = run(redis_url, namespace + "g", lines, general=True)
    assert fast_errors == general_errors and len(fast_errors) == 2 * len(SEEDS)
    fast = stream_tasks(sync_redis, namespace)
    general = stream_tasks(sync_redis, namespace + "g")
    for task in general:
        task["stream"] = task["stream"].replace(namespace + "g", namespace)
    assert fast == general and len(fast) > 2 * 23
    sync_redis.delete(*sync_redis.scan_iter(f"{namespace}g:*"))


def test_a_raw_newline_in_a_task_json_is_refused_before_sending() -> None:
    # The one-site packing's guard: enqueue.lua splits the JSONs at newlines.
    w = writer()
    seed = make_seed([f"https://a.example/{i}" for i in range(3)], SEEDS[0])
    items = [item for item in expand_checked(seed, as_template=lambda template: True)
             if not isinstance(item, UrlError)]
    encode = w.encoder(items[0][0]).encode
    chunk = [encode(task, canonical, payload) for task, canonical, payload, _ in items]
    keys, args = w._script_args(chunk[0].stream, chunk)
    assert keys == ["t:tasks", "t:seen:{news}"]
    assert args[1] == "".join(f"{item.payload}\n" for item in chunk)
    assert args[2] == b"".join(b"\x00\x01" + item.fingerprint[:6] for item in chunk)
    chunk[1] = chunk[1]._replace(payload='{"a":\n1}')
    with pytest.raises(ValueError, match="raw newline"):
        w._script_args(chunk[0].stream, chunk)


# -- overlapped batches: packed while the one before runs, sent in order, never after a failure --

class FailingWriter(TaskWriter):
    """Fails its ``fail_at``-th enqueue call (1-based) before sending anything, and flushes
    Redis's script cache before its ``flush_at``-th."""

    def __init__(self, *args: Any, fail_at: int = 0, flush_at: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail_at, self.flush_at, self.calls = fail_at, flush_at, 0

    async def enqueue(self, encoded: Any, order: ScriptOrder | None = None,
                      holds: Any = None) -> Any:
        self.calls += 1
        if self.calls == self.fail_at:
            await asyncio.sleep(0.05)  # (the next batch is packed and waiting by then)
            raise RuntimeError("boom")
        if self.calls == self.flush_at:
            await self._redis.script_flush()
        return await super().enqueue(encoded, order, holds)


@pytest.mark.parametrize("single", [False, True], ids=["pipelined", "single-connection"])
def test_batches_reach_the_stream_in_order_and_none_after_a_failure(
    redis_url: str, namespace: str, sync_redis: redis.Redis, single: bool
) -> None:
    urls = [f"https://a.example/{i}" for i in range(40)]
    lines = [json.dumps({**SEEDS[0], "payload": {"urls": urls}})]

    async def main(**options: int) -> tuple[str, int]:
        client = aioredis.Redis.from_url(redis_url, single_connection_client=single)
        writer = FailingWriter(client, KeyLayout(namespace), **options)
        summary = ExpandSummary()
        try:
            await expand_lines(lines, writer, ExpandOptions(batch_size=5), on_error=print,
                               summary=summary)
            return "", summary.enqueued
        except RuntimeError as exc:
            return str(exc), summary.enqueued
        finally:
            await client.aclose()

    assert asyncio.run(main()) == ("", 40)
    assert [task["url"] for task in stream_tasks(sync_redis, namespace)] == urls
    sync_redis.delete(*sync_redis.scan_iter(f"{namespace}:*"))
    # The script cache flushed mid-run (a Redis restart): loaded again, nothing lost or reordered.
    assert asyncio.run(main(flush_at=3)) == ("", 40)
    assert [task["url"] for task in stream_tasks(sync_redis, namespace)] == urls
    sync_redis.delete(*sync_redis.scan_iter(f"{namespace}:*"))
    # The 4th batch fails: the three before it are in, the 5th (packed meanwhile) is not sent.
    error, enqueued = asyncio.run(main(fail_at=4))
    assert (error, enqueued) == ("boom", 15)
    assert [task["url"] for task in stream_tasks(sync_redis, namespace)] == urls[:15]


def test_a_call_after_one_that_failed_sends_nothing(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    w = writer()
    seed = make_seed(["https://a.example/1"], SEEDS[0])
    [(task, canonical, payload, _)] = expand_checked(seed, as_template=lambda template: True)
    item = w.encoder(task).encode(task, canonical, payload)

    async def main() -> None:
        client = aioredis.Redis.from_url(redis_url)
        real = TaskWriter(client, KeyLayout(namespace))
        failed = ScriptOrder()
        failed.finish(sent=False)
        try:
            with pytest.raises(NotSent):
                await real.enqueue([item], ScriptOrder(failed))
        finally:
            await client.aclose()

    asyncio.run(main())
    assert stream_tasks(sync_redis, namespace) == []


# -- repeats within one call are left out client-side, with the script's very answer ----------

@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 12), min_size=1, max_size=40), st.sets(st.integers(0, 12)),
       st.booleans())
def test_repeats_left_out_of_a_call_get_the_answer_the_script_gives(
    redis_url: str, namespace: str, ids: list[int], seen: set[int], two_sites: bool
) -> None:
    import meteorseed_scrapy.queue.enqueue.enqueue_calls as writer_module

    def encoded(w: TaskWriter, numbers: Any) -> list[Any]:
        out = []
        for n in numbers:
            site = "news" if not two_sites or n % 2 else "other"
            seed = make_seed([f"https://a.example/{n}"], {**SEEDS[2], "site_id": site})
            [(task, canonical, payload, _)] = expand_checked(seed,
                                                             as_template=lambda template: True)
            out.append(w.encoder(task).encode(task, canonical, payload))
        return out

    async def run(ns: str, leave_out: bool) -> tuple[Any, list[str]]:
        client = aioredis.Redis.from_url(redis_url)
        original = writer_module._without_repeats
        if not leave_out:
            writer_module._without_repeats = lambda chunk: (chunk, None)  # type: ignore[assignment]
        try:
            w = TaskWriter(client, KeyLayout(ns))
            await w.enqueue(encoded(w, sorted(seen)))
            result = await w.enqueue(encoded(w, ids))
            entries = []
            for stream in KeyLayout(ns).streams:
                entries += [json.loads(fields[b"t"])["url"]
                            for _, fields in await client.xrange(stream)]
            return result, entries
        finally:
            writer_module._without_repeats = original
            for key in [k async for k in client.scan_iter(f"{ns}:*")]:
                await client.delete(key)
            await client.aclose()

    got = asyncio.run(run(namespace + "a", leave_out=True))
    want = asyncio.run(run(namespace + "b", leave_out=False))
    assert (got[0], got[0].fresh) == (want[0], want[0].fresh)
    assert got[1] == want[1]

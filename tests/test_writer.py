"""TaskWriter and enqueue.lua on a real Redis: dedup, atomicity, release, backlog, backpressure."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.queue.enqueue.dedup import fingerprint_bytes
from meteorseed_scrapy.queue.enqueue.enqueue_calls import (
    CHUNK_SIZE,
    AddResult,
    Encoded,
    pack_tasks,
)
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.task.canonical import canonical_url
from meteorseed_scrapy.task.exec_task import MAX_MESSAGE_BYTES, ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.testing.polling import wait_until
from tests.queue_helpers import is_seen

T = TypeVar("T")
T_FIXED = 2_000_000_000  # a fixed clock for direct script calls


def task(url: str, site: str = "site_a", **kwargs: Any) -> ExecTask:
    return ExecTask.create(seed_id="seed1", site_id=site, url=url, **kwargs)


def with_writer(redis_url: str, namespace: str,
                body: Callable[[TaskWriter], Awaitable[T]]) -> T:
    async def main() -> T:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await body(TaskWriter(client, KeyLayout(namespace)))
        finally:
            await client.aclose()

    return asyncio.run(main())


def stream_tasks(sync_redis: redis.Redis, namespace: str) -> list[ExecTask]:
    entries: Any = sync_redis.xrange(KeyLayout(namespace).stream)  # redis-py's union type
    return [ExecTask.from_message(fields) for _, fields in entries]


def drain(sync_redis: redis.Redis, keys: KeyLayout, count: int | None = None) -> int:
    """Act as a worker: read up to ``count`` entries, then XACK + XDEL them."""
    try:
        sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    reply: Any = sync_redis.xreadgroup(keys.group, "c1", {keys.stream: ">"}, count=count)
    ids = [msg_id for _, messages in reply for msg_id, _ in messages]
    if ids:
        sync_redis.xack(keys.stream, keys.group, *ids)
        sync_redis.xdel(keys.stream, *ids)
    return len(ids)


# -- fingerprint -----------------------------------------------------------------------------

def test_fingerprint_uses_canonical_url_and_is_compact() -> None:
    a = fingerprint_bytes(task("https://Example.com/p?b=2&a=1#frag"))
    assert a == fingerprint_bytes(task("https://example.com/p?a=1&b=2"))
    assert a != fingerprint_bytes(task("https://example.com/p?a=1&b=3"))
    assert len(a) == 16  # (dedup_lib.lua keeps its first 6 bytes)


def test_fingerprint_includes_method_and_body_for_non_get() -> None:
    url = "https://example.com/search"
    get = fingerprint_bytes(task(url))
    post_a = fingerprint_bytes(task(url, method="POST", body="q=a"))
    post_b = fingerprint_bytes(task(url, method="POST", body="q=b"))
    assert len({get, post_a, post_b}) == 3
    assert fingerprint_bytes(task(url, method="post", body="q=a")) == post_a
    assert fingerprint_bytes(task(url, method="HEAD")) != get


# -- add ---------------------------------------------------------------------------------------

def test_dedup_within_a_batch_and_across_batches(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    first = [
        task("https://example.com/1"),
        task("https://example.com/2"),
        task("https://EXAMPLE.com/1#top"),  # same canonical URL as the first
        task("https://example.com/1", site="site_b"),  # dedup is per site
    ]
    second = [task("https://example.com/2"), task("https://example.com/3")]

    async def body(writer: TaskWriter) -> tuple[AddResult, AddResult]:
        return await writer.add(first), await writer.add(second)

    r1, r2 = with_writer(redis_url, namespace, body)
    assert r1 == AddResult(enqueued=3, duplicates=1)
    assert r1.fresh == (True, True, False, True)  # which task went in, in the given order
    assert r2 == AddResult(enqueued=1, duplicates=1)
    assert r2.fresh == (False, True)
    got = [(t.site_id, t.url) for t in stream_tasks(sync_redis, namespace)]
    assert got == [
        ("site_a", "https://example.com/1"),
        ("site_a", "https://example.com/2"),
        ("site_b", "https://example.com/1"),
        ("site_a", "https://example.com/3"),
    ]
    keys = KeyLayout(namespace)
    # the exact layer of a site without a re-crawl window lives in generation 0:0
    assert int(sync_redis.hget(f"{keys.seen('site_a')}:0:0", "n") or 0) == 3
    assert int(sync_redis.hget(f"{keys.seen('site_b')}:0:0", "n") or 0) == 1
    # the stream carries the tasks themselves, intact
    assert stream_tasks(sync_redis, namespace)[0] == first[0]


def test_no_dedup_enqueues_every_task_and_leaves_the_dedup_layer_alone(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    tasks = [task("https://example.com/1"), task("https://example.com/1")]
    result = with_writer(redis_url, namespace, lambda w: w.add(tasks, dedup=False))
    assert result == AddResult(enqueued=2, duplicates=0)
    assert sync_redis.xlen(KeyLayout(namespace).stream) == 2
    assert not sync_redis.exists(KeyLayout(namespace).seen("site_a"))


@pytest.mark.parametrize("dedup", [True, False])
def test_a_url_no_reader_could_canonicalise_is_refused_before_anything_is_sent(
    redis_url: str, namespace: str, sync_redis: redis.Redis, dedup: bool
) -> None:
    # Deduplicated or not (a dont_filter request, a migrated one), the writer refuses what
    # every reader would (ExecTask.from_message): by name, now, not as a dead letter later.
    tasks = [task("https://example.com/1"), task("http://[")]
    with pytest.raises(TaskError, match=r"^url: cannot be canonicalised"):
        with_writer(redis_url, namespace, lambda w: w.add(tasks, dedup=dedup))
    assert sync_redis.xlen(KeyLayout(namespace).stream) == 0


def test_add_sends_one_script_call_per_chunk_in_order(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    n = 2 * CHUNK_SIZE + 7
    tasks = [task(f"https://example.com/{i}") for i in range(n)]

    def evalsha_calls() -> int:
        stats = sync_redis.info("commandstats").get("cmdstat_evalsha", {})
        return int(stats.get("calls", 0))

    async def body(writer: TaskWriter) -> AddResult:
        await writer.add([task("https://example.com/warm-up")])  # loads the script
        before = evalsha_calls()
        result = await writer.add(tasks)
        assert evalsha_calls() - before == 3
        return result

    assert with_writer(redis_url, namespace, body) == AddResult(enqueued=n, duplicates=0)
    urls = [t.url for t in stream_tasks(sync_redis, namespace)][1:]
    assert urls == [t.url for t in tasks]


def test_too_large_task_fails_before_anything_is_sent(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    huge = task("https://example.com/big", meta={"blob": "x" * MAX_MESSAGE_BYTES})
    tasks = [task(f"https://example.com/{i}") for i in range(CHUNK_SIZE + 1)] + [huge]
    with pytest.raises(TaskError, match="bytes"):
        with_writer(redis_url, namespace, lambda w: w.add(tasks))
    keys = KeyLayout(namespace)
    assert sync_redis.xlen(keys.stream) == 0
    assert not sync_redis.exists(keys.seen("site_a"))


def test_script_fails_as_a_whole_on_a_wrong_key_type(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)
    sync_redis.set(keys.seen("site_b"), "not a hash")
    tasks = [task("https://example.com/1"), task("https://example.com/2", site="site_b")]
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        with_writer(redis_url, namespace, lambda w: w.add(tasks))
    assert sync_redis.xlen(keys.stream) == 0
    assert not sync_redis.exists(keys.seen("site_a"))


# -- enqueue.lua's arguments: a malformed batch fails as a whole, naming what is wrong ---------

ENTRY = b"\x00\x01" + b"abcdef"  # root index 1 and a dedup entry


def _call_args(now: str, packed: list[Any], owners: str = "") -> list[Any]:
    """enqueue.lua's arguments around ``pack_tasks``' (no events stream)."""
    return [now, *packed[:2], "", owners, "", "0", *packed[2:]]


@pytest.mark.parametrize(("args", "error", "owners"), [
    (['{"a":1}\n'], "bytes of roots and entries for 1 tasks", ""),  # no roots and entries
    (['{"a":1}\n', ENTRY + ENTRY], "bytes of roots and entries for 1 tasks", ""),
    (['{"a":1}\n', ENTRY[:7]], "bytes of roots and entries for 1 tasks", ""),
    (['{"a":1}\n{"b":2}', ENTRY * 2], "task 2 has no newline", ""),
    (['{"a":1}\n', b"\x00\x02abcdef"], "bad root index 2", ""),
    (['{"a":1}\n', b"\xff\xffabcdef"], "bad root index 65535", ""),
    (['{"a":1}\n', ENTRY, "1", "30 days"], "bad window 1 30 days", ""),
    (['{"a":1}\n', ENTRY, "1", "-5"], "bad window 1 -5", ""),
    (['{"a":1}\n', ENTRY, "2", "60"], "bad window 2 60", ""),  # no task 2
    (['{"a":1}\n', ENTRY, "1"], "bad window 1 nil", ""),  # a window without its value
    (['{"a":1}\n', ENTRY, "x", "60"], "bad window x 60", ""),
    (['{"a":1}\n', ENTRY], "2 seed lines for 1 tasks", "s1\tx\ns2\tx\n"),
], ids=["empty-meta", "meta-too-long", "meta-too-short", "no-final-newline", "root-past-keys",
        "root-huge", "window-words", "window-negative", "window-for-no-task",
        "window-missing", "window-task-not-a-number", "seed-lines-not-one-per-task"])
def test_a_malformed_batch_is_refused_before_anything_is_written(
    sync_redis: redis.Redis, namespace: str, args: list[Any], error: str, owners: str
) -> None:
    keys = KeyLayout(namespace)
    script = sync_redis.register_script(scripts.script_source("enqueue"))
    with pytest.raises(redis.ResponseError, match=error):
        script(keys=[keys.stream, keys.seen("site_a")], args=_call_args("", args, owners))
    assert sync_redis.xlen(keys.stream) == 0
    assert not sync_redis.exists(keys.seen("site_a"))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.tuples(
    st.integers(0, 2), st.binary(min_size=16, max_size=16),
    st.sampled_from(["", "0", "60", "86400"]),
    st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)),
            max_size=40)), max_size=30))
def test_any_batch_packs_and_unpacks_task_for_task(
    sync_redis: redis.Redis, namespace: str, records: list[tuple[int, bytes, str, str]]
) -> None:
    # Whatever the JSON text, roots and windows: every task comes out as its own entry, in
    # order, and a task whose entry repeats an earlier one of its root under the same window
    # is the duplicate (a task's window becomes its root's: a new window, new generations).
    keys = KeyLayout(namespace)
    sync_redis.delete(keys.stream, keys.seen("a"), keys.seen("b"))
    for key in sync_redis.scan_iter(f"{namespace}:*"):
        sync_redis.delete(key)
    script = sync_redis.register_script(scripts.script_source("enqueue"))
    records = [(r, fp, w if r else "", f"[{text!r}]") for r, fp, w, text in records]
    enqueued, dups, flags = script(keys=[keys.stream, keys.seen("a"), keys.seen("b")],
                                   args=_call_args(str(T_FIXED), pack_tasks(records)))
    seen: set[tuple[int, int, bytes]] = set()
    window = {1: 0, 2: 0}
    expected = []
    for root, fp, w, _ in records:
        if w:
            window[root] = int(w)
        key = (root, window.get(root, 0), fp[:6])
        expected.append(root == 0 or key not in seen)
        seen.add(key)
    assert flags == "".join("1" if e else "0" for e in expected)
    assert (int(enqueued), int(dups)) == (sum(expected), len(expected) - sum(expected))
    texts = [fields["t"] for _, fields in sync_redis.xrange(keys.stream)]
    assert texts == [p for (_, _, _, p), e in zip(records, expected, strict=True) if e]


@settings(max_examples=50, deadline=None)
@given(fps=st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=20),
       window=st.sampled_from(["", "0", "3600"]),
       texts=st.lists(st.text(st.characters(blacklist_characters="\n",
                                            blacklist_categories=("Cs",))), min_size=20))
def test_a_one_site_chunk_packs_as_the_general_path_would(
    fps: list[bytes], window: str, texts: list[str]
) -> None:
    # The joins-only path of a one-site, one-window chunk sends exactly what pack_tasks does.
    chunk = [Encoded("ns:seen:{s}", fp, window, f"[{text!r}]", "ns:tasks")
             for fp, text in zip(fps, texts, strict=False)]
    writer = TaskWriter(aioredis.Redis(), KeyLayout("ns"))
    records = [(1, e.fingerprint, window if i == 0 else "", e.payload)
               for i, e in enumerate(chunk)]
    packed = pack_tasks(records)
    assert writer._script_args("ns:tasks", chunk) == (
        ["ns:tasks", "ns:seen:{s}"],
        ["", *packed[:2], "ns:events", "", "", str(writer.progress_retention), *packed[2:]])


@settings(max_examples=50, deadline=None)
@given(path=st.text("abc%/?=&é", max_size=20), window=st.sampled_from([None, 0, 3600]),
       method=st.sampled_from(["GET", "POST"]), body=st.sampled_from(["", "q=1"]),
       lane=st.sampled_from([None, "scheduled", "realtime"]), dedup=st.booleans(),
       priority=st.integers(-5, 5))
def test_a_seeds_encoder_encodes_each_task_as_encode_does(
    path: str, window: int | None, method: str, body: str, lane: str | None, dedup: bool,
    priority: int
) -> None:
    meta: dict[str, Any] = {} if window is None else {"recrawl_after": window}
    writer = TaskWriter(aioredis.Redis(), KeyLayout("ns"), lane=lane)
    first, each = (task(f"https://example.com/{i}/{path}", meta=meta, method=method,
                        body=body, priority=priority) for i in range(2))
    canonical = canonical_url(each.url)
    encoded = writer.encoder(first, dedup).encode(each, canonical, each.to_message()["t"])
    assert encoded == writer.encode(each, dedup, canonical)


def test_pack_tasks_refuses_a_json_with_a_raw_newline() -> None:
    with pytest.raises(ValueError, match="raw newline"):
        pack_tasks([(0, b"", "", '{"a":\n1}')])


def test_two_concurrent_writers_never_enqueue_a_url_twice(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    urls = [f"https://example.com/item/{i}" for i in range(5000)]

    async def main() -> list[AddResult]:
        clients = [aioredis.Redis.from_url(redis_url) for _ in range(2)]
        try:
            writers = [TaskWriter(c, KeyLayout(namespace)) for c in clients]
            # each writer has its own task objects (own task ids), as two processes would
            return await asyncio.gather(*(
                w.add([task(u) for u in (urls if i == 0 else reversed(urls))])
                for i, w in enumerate(writers)
            ))
        finally:
            for c in clients:
                await c.aclose()

    results = asyncio.run(main())
    assert sum(r.enqueued for r in results) == 5000
    assert sum(r.duplicates for r in results) == 5000
    assert sync_redis.xlen(KeyLayout(namespace).stream) == 5000
    assert sorted(t.url for t in stream_tasks(sync_redis, namespace)) == sorted(urls)


def test_release_makes_a_url_enqueuable_again(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    first = task("https://example.com/retry-me", method="POST", body="x=1")
    again = task("https://example.com/retry-me", method="POST", body="x=1")

    async def body(writer: TaskWriter) -> list[AddResult]:
        out = [await writer.add([first]), await writer.add([again])]
        await writer.release(first)
        out.append(await writer.add([again]))
        return out

    assert with_writer(redis_url, namespace, body) == [
        AddResult(1, 0), AddResult(0, 1), AddResult(1, 0)
    ]
    assert sync_redis.xlen(KeyLayout(namespace).stream) == 2


def test_is_seen_and_release_report_what_they_found(redis_url: str, namespace: str) -> None:
    a, b = task("https://example.com/a"), task("https://example.com/b")

    async def body(writer: TaskWriter) -> list[bool]:
        out = [await is_seen(writer, a), await writer.release(a)]  # nothing recorded yet
        await writer.add([a, b])
        out += [await is_seen(writer, a), await writer.release(a), await is_seen(writer, a),
                await writer.release(a), await is_seen(writer, b)]
        return out

    assert with_writer(redis_url, namespace, body) == [
        False, False, True, True, False, False, True
    ]


# -- backlog and backpressure ------------------------------------------------------------------

def test_backlog_counts_waiting_tasks_only(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)

    async def body(writer: TaskWriter) -> list[int]:
        seen = [await writer.backlog()]  # no stream at all
        await writer.add([task(f"https://example.com/{i}") for i in range(10)])
        seen.append(await writer.backlog())  # no consumer group yet: all waiting
        sync_redis.xgroup_create(keys.stream, keys.group, id="0")
        sync_redis.xreadgroup(keys.group, "c1", {keys.stream: ">"}, count=4)
        seen.append(await writer.backlog())  # 4 delivered, pending
        assert drain(sync_redis, keys, count=3) == 3  # 3 more delivered, acked and deleted
        seen.append(await writer.backlog())
        drain(sync_redis, keys)
        seen.append(await writer.backlog())
        return seen

    assert with_writer(redis_url, namespace, body) == [0, 10, 6, 3, 0]
    assert sync_redis.xlen(keys.stream) == 4  # the 4 never acked are still there


def test_wait_for_room_returns_at_once_when_there_is_room(
    redis_url: str, namespace: str
) -> None:
    calls: list[int] = []

    async def body(writer: TaskWriter) -> None:
        await writer.add([task(f"https://example.com/{i}") for i in range(3)])
        await writer.wait_for_room(3, calls.append, poll=0.01)

    with_writer(redis_url, namespace, body)
    assert calls == []


def test_wait_for_room_waits_until_workers_drain_the_backlog(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)

    async def body(writer: TaskWriter) -> list[int]:
        await writer.add([task(f"https://example.com/{i}") for i in range(5)])
        calls: list[int] = []
        polls = 0
        looked = writer.backlog

        async def counted() -> int:
            nonlocal polls
            polls += 1
            return await looked()

        writer.backlog = counted  # type: ignore[method-assign]
        waiting = asyncio.create_task(writer.wait_for_room(2, calls.append, poll=0.01))
        await wait_until(lambda: polls >= 5, 30, 0.01)  # several polls: still over the limit
        assert not waiting.done()
        assert drain(sync_redis, keys, count=3) == 3
        await asyncio.wait_for(waiting, 30)
        return calls

    # reported once (not once per poll), with the backlog it saw
    assert with_writer(redis_url, namespace, body) == [5]
    assert sync_redis.xlen(keys.stream) == 2  # waiting never trims


def test_wait_for_room_rejects_a_negative_limit(redis_url: str, namespace: str) -> None:
    with pytest.raises(ValueError, match="max_backlog"):
        with_writer(redis_url, namespace, lambda w: w.wait_for_room(-1, print))

"""StreamConsumer against a real redis-server (read, ack, reclaim, touch, hand back, dead letter).

pytest-asyncio is not used: each test runs its coroutine with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.consume.acks import Completion, TaskRecords
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delivery import Delivery
from meteorseed_scrapy.queue.consume.group import ConsumerGroup
from meteorseed_scrapy.queue.enqueue.dedup import fingerprint_bytes
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.task.exec_task import MAX_MESSAGE_BYTES, ExecTask
from meteorseed_scrapy.testing.polling import wait_for
from tests.queue_helpers import ack, is_seen, touch

T = TypeVar("T")


def arun(redis_url: str, body: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``body(client)`` on a fresh ``redis.asyncio`` client (decode_responses=True)."""

    async def main() -> T:
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def make_task(n: int = 0, site_id: str = "news") -> ExecTask:
    return ExecTask.create(seed_id="s1", site_id=site_id, url=f"https://example.com/p/{n}")


def add(sync_redis: redis.Redis, keys: KeyLayout, fields: dict[str, str]) -> str:
    return str(sync_redis.xadd(keys.stream, fields))


def pending(sync_redis: redis.Redis, keys: KeyLayout, idle_ms: int | None = None
            ) -> dict[str, dict[str, Any]]:
    """XPENDING extended form, keyed by message id."""
    rows = sync_redis.xpending_range(keys.stream, GROUP, "-", "+", 1000, idle=idle_ms)
    return {row["message_id"]: row for row in rows}


def pending_count(sync_redis: redis.Redis, keys: KeyLayout) -> int:
    return int(sync_redis.xpending(keys.stream, GROUP)["pending"])


def set_idle(sync_redis: redis.Redis, keys: KeyLayout, owner: str, msg_id: str, ms: int) -> None:
    """Test setup: make an entry look idle for ``ms`` (JUSTID keeps its delivery count)."""
    sync_redis.xclaim(keys.stream, GROUP, owner, 0, [msg_id], idle=ms, justid=True)


@pytest.fixture
def keys(namespace: str) -> KeyLayout:
    return KeyLayout(namespace)


# -- group and read ------------------------------------------------------------------------


def test_ensure_group_twice_and_reads_entries_added_before_it(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    task = make_task()
    msg_id = add(sync_redis, keys, task.to_message())

    async def body(client: Redis) -> list[Delivery]:
        consumer = StreamConsumer(client, keys, "worker-a")
        await consumer.ensure_group()
        await consumer.ensure_group()
        return await consumer.read(10, 100)

    got = arun(redis_url, body)
    groups = sync_redis.xinfo_groups(keys.stream)
    assert [g["name"] for g in groups] == [GROUP]
    assert [d.msg_id for d in got] == [msg_id]
    assert got[0].task == task


def test_ensure_group_creates_the_stream(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    arun(redis_url, lambda c: StreamConsumer(c, keys, "w").ensure_group())
    assert sync_redis.exists(keys.stream) == 1
    assert sync_redis.xlen(keys.stream) == 0


def test_ensure_group_does_not_swallow_other_errors(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    sync_redis.set(keys.stream, "not a stream")
    with pytest.raises(ResponseError):
        arun(redis_url, lambda c: StreamConsumer(c, keys, "w").ensure_group())


def test_read_decodes_tasks_and_flags_malformed_entries(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    task = make_task(1)
    good = add(sync_redis, keys, task.to_message())
    no_version = add(sync_redis, keys, {"junk": "1"})
    bad_json = add(sync_redis, keys, {"v": "1", "t": "{oops"})
    future = add(sync_redis, keys, {"v": "99", "t": task.to_message()["t"]})

    async def body(client: Redis) -> tuple[list[Delivery], list[Delivery]]:
        consumer = StreamConsumer(client, keys, "worker-a")
        await consumer.ensure_group()
        first = await consumer.read(10, 100)
        again = await consumer.read(10, 50)
        return first, again

    first, again = arun(redis_url, body)
    assert again == []
    by_id = {d.msg_id: d for d in first}
    assert [d.msg_id for d in first] == [good, no_version, bad_json, future]
    assert all(d.deliveries == 1 for d in first)

    assert by_id[good].task == task
    assert by_id[good].error == ""
    assert dict(by_id[good].fields) == task.to_message()

    for msg_id in (no_version, bad_json, future):
        assert by_id[msg_id].task is None
        assert by_id[msg_id].error.startswith("malformed message: ")
    assert "v:" in by_id[no_version].error
    assert "t:" in by_id[bad_json].error and "JSON" in by_id[bad_json].error
    assert "'99'" in by_id[future].error
    assert dict(by_id[no_version].fields) == {"junk": "1"}

    assert set(pending(sync_redis, keys)) == {good, no_version, bad_json, future}


def raw_client(redis_url: str) -> redis.Redis:
    """A client that writes and reads bytes as they are (no decoding)."""
    return redis.Redis.from_url(redis_url)


def test_read_delivers_a_message_that_is_not_utf8_alone_and_never_replaces_the_byte(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    # (Before: the client's decode_responses=True raised UnicodeDecodeError out of read(), the
    # whole batch stayed pending; with errors="replace" the task would run with another URL.)
    before, after = make_task(1), make_task(2)
    bad_t = before.to_message()["t"].encode().replace(b"/p/1", b"/p/\xff")
    add(sync_redis, keys, before.to_message())
    bad_id = raw_client(redis_url).xadd(keys.stream, {b"v": b"1", b"t": bad_t}).decode()
    add(sync_redis, keys, after.to_message())

    async def body(client: Redis) -> list[Delivery]:
        consumer = StreamConsumer(client, keys, "worker-a")
        await consumer.ensure_group()
        return await consumer.read(10, 100)

    got = arun(redis_url, body)
    assert [d.task for d in got if d.task is not None] == [before, after]
    [bad] = [d for d in got if d.task is None]
    assert bad.msg_id == bad_id
    offset = bad_t.index(b"\xff")
    assert bad.error == f"malformed message: t: is not valid UTF-8 (byte 0xff at offset {offset})"
    assert dict(bad.raw_fields)["t"].encode("utf-8", "surrogateescape") == bad_t


def test_blocking_read_gives_the_fields_as_stored(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    """A message that arrives while read() blocks: not UTF-8, and a field name given twice
    (which redis-py's parsed XREADGROUP reply would have merged into one)."""
    good_t = make_task(1).to_message()["t"].encode()

    async def body(client: Redis) -> list[Delivery]:
        consumer = StreamConsumer(client, keys, "worker-a")
        await consumer.ensure_group()
        reading = asyncio.ensure_future(consumer.read(10, 30_000))

        for _ in range(400):  # until read() waits in XREAD (polled, at most 20 s)
            if any(c.get("cmd") == "xread" for c in await client.client_list()):
                break
            await asyncio.sleep(0.05)
        raw = raw_client(redis_url)
        raw.execute_command("XADD", keys.stream, "*", "v", "1", "t", good_t, "t", b"\xfe{}")
        return await asyncio.wait_for(reading, 20)

    [got] = arun(redis_url, body)
    assert got.task is None
    assert got.error == "malformed message: t: appears more than once in the message"
    assert [(k, v.encode("utf-8", "surrogateescape")) for k, v in got.raw_fields] == [
        ("v", b"1"), ("t", good_t), ("t", b"\xfe{}")]
    assert set(pending(sync_redis, keys)) == {got.msg_id}


def test_read_respects_count(redis_url: str, keys: KeyLayout, sync_redis: redis.Redis) -> None:
    ids = [add(sync_redis, keys, make_task(n).to_message()) for n in range(3)]

    async def body(client: Redis) -> tuple[list[Delivery], list[Delivery]]:
        consumer = StreamConsumer(client, keys, "worker-a")
        await consumer.ensure_group()
        return await consumer.read(2, 100), await consumer.read(2, 100)

    first, second = arun(redis_url, body)
    assert [d.msg_id for d in first] == ids[:2]
    assert [d.msg_id for d in second] == ids[2:]


# -- completion records and ack ---------------------------------------------------------------


def test_completion_records_are_written_with_the_acks_and_their_ttl(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    record = json.dumps({"outcome": "done", "items": 3})
    t1, t2, t3 = (make_task(n) for n in range(3))
    for task in (t1, t2, t3):
        add(sync_redis, keys, task.to_message())

    async def body(client: Redis) -> tuple[int, list[str | None]]:
        consumer = StreamConsumer(client, keys, "worker-a")
        await consumer.ensure_group()
        first, second, _ = await consumer.read(3, 100)
        # t2 has no record: a None in ``done`` acks it alone.
        acked = await consumer.complete([first.ref, second.ref], 60,
                                        done=[Completion(t1, record), None])
        return acked, await TaskRecords(client, keys).completion_records([t1, t2, t3])

    assert arun(redis_url, body) == (2, [record, None, None])
    assert sync_redis.get(keys.done(t1.task_id)) == record
    assert 0 < sync_redis.ttl(keys.done(t1.task_id)) <= 60
    assert sync_redis.xlen(keys.stream) == 1 and pending_count(sync_redis, keys) == 1
    assert arun(redis_url, lambda c: TaskRecords(c, keys).completion_records([])) == []


def test_ack_acks_and_deletes_entries(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    t1, t2 = make_task(1), make_task(2)
    id1 = add(sync_redis, keys, t1.to_message())
    id2 = add(sync_redis, keys, t2.to_message())

    async def body(client: Redis) -> dict[str, Any]:
        consumer = StreamConsumer(client, keys, "worker-a")
        await consumer.ensure_group()
        await consumer.read(10, 100)
        out: dict[str, Any] = {"before": (sync_redis.xlen(keys.stream),
                                          pending_count(sync_redis, keys))}
        out["empty"] = await ack(consumer, [])
        out["first"] = await ack(consumer, [(keys.stream, id1)])
        out["after_first"] = (sync_redis.xlen(keys.stream), pending_count(sync_redis, keys))
        out["again"] = await ack(consumer, [(keys.stream, id1)])
        out["second"] = await ack(consumer, [(keys.stream, id2)])
        return out

    out = arun(redis_url, body)
    assert out["before"] == (2, 2)
    assert out["empty"] == 0
    assert out["first"] == 1
    assert out["after_first"] == (1, 1)
    assert sync_redis.xrange(keys.stream, id1, id1) == []
    assert out["again"] == 0
    assert out["second"] == 1
    assert sync_redis.xlen(keys.stream) == 0
    assert pending_count(sync_redis, keys) == 0


def test_ack_many_at_once(redis_url: str, keys: KeyLayout, sync_redis: redis.Redis) -> None:
    ids = [add(sync_redis, keys, make_task(n).to_message()) for n in range(3)]
    waiting = add(sync_redis, keys, make_task(9).to_message())

    async def body(client: Redis) -> int:
        consumer = StreamConsumer(client, keys, "worker-a")
        await consumer.ensure_group()
        await consumer.read(3, 100)
        return await ack(consumer, [(keys.stream, i) for i in ids])

    assert arun(redis_url, body) == 3
    assert [entry_id for entry_id, _ in sync_redis.xrange(keys.stream)] == [waiting]
    assert pending_count(sync_redis, keys) == 0


# -- reclaim ---------------------------------------------------------------------------------


def test_reclaim_takes_only_entries_idle_longer_than_min_idle(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    t1, t2 = make_task(1), make_task(2)
    id1 = add(sync_redis, keys, t1.to_message())
    id2 = add(sync_redis, keys, t2.to_message())

    async def body(client: Redis) -> list[Delivery]:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        await a.read(10, 100)
        set_idle(sync_redis, keys, "worker-a", id1, 120_000)
        return await b.reclaim(60, 10)

    got = arun(redis_url, body)
    assert [d.msg_id for d in got] == [id1]
    assert got[0].task == t1
    assert got[0].deliveries == 2
    rows = pending(sync_redis, keys)
    assert rows[id1]["consumer"] == "worker-b"
    assert rows[id1]["times_delivered"] == 2
    assert rows[id2]["consumer"] == "worker-a"
    assert rows[id2]["times_delivered"] == 1


def test_reclaim_after_min_idle_has_passed(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    task = make_task()
    msg_id = add(sync_redis, keys, task.to_message())

    async def body(client: Redis) -> tuple[list[Delivery], list[Delivery]]:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        await a.read(10, 100)
        too_soon = await b.reclaim(3600, 10)  # nothing has been idle for an hour
        deadline = time.monotonic() + 20
        got: list[Delivery] = []
        while not got and time.monotonic() < deadline:
            await asyncio.sleep(0.25)  # just past the 200 ms min idle
            got = await b.reclaim(0.2, 10)
        return too_soon, got

    too_soon, got = arun(redis_url, body)
    assert too_soon == []
    assert [d.msg_id for d in got] == [msg_id]
    assert got[0].task == task
    assert got[0].deliveries == 2
    assert pending(sync_redis, keys)[msg_id]["consumer"] == "worker-b"


def test_reclaim_counts_deliveries_and_reports_over_limit(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    max_deliveries = 3
    task = make_task()
    msg_id = add(sync_redis, keys, task.to_message())
    bad_id = add(sync_redis, keys, {"junk": "x"})

    async def body(client: Redis) -> list[list[Delivery]]:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        await a.read(10, 100)
        # min idle 0: every pending entry is claimable, each claim is one more delivery
        return [await b.reclaim(0, 10), await a.reclaim(0, 10), await b.reclaim(0, 10)]

    rounds = arun(redis_url, body)
    counts = [{d.msg_id: d.deliveries for d in r} for r in rounds]
    assert counts == [{msg_id: 2, bad_id: 2}, {msg_id: 3, bad_id: 3}, {msg_id: 4, bad_id: 4}]
    last = {d.msg_id: d for d in rounds[-1]}
    assert last[msg_id].deliveries > max_deliveries
    assert last[msg_id].task == task
    assert last[bad_id].task is None and "malformed" in last[bad_id].error
    assert pending(sync_redis, keys)[msg_id]["times_delivered"] == 4


def test_reclaim_delivers_messages_that_cannot_be_decoded(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    task = make_task()
    raw = raw_client(redis_url)
    ids = [raw.xadd(keys.stream, fields).decode() for fields in (
        # RecursionError in json.loads (3.13's parses 5,000 levels; 100,000: 200 KB, under the cap)
        {b"v": b"1", b"t": b"[" * 100_000 + b"]" * 100_000},
        {b"\xff": b"1"},
        {b"v": b"1", b"t": task.to_message()["t"].encode()},
    )]

    async def body(client: Redis) -> list[Delivery]:
        a = StreamConsumer(client, keys, "worker-a")
        await a.ensure_group()
        raw.xreadgroup(GROUP, "ghost", {keys.stream: ">"})  # pending on a worker that died
        return await a.reclaim(0, 10)

    got = {d.msg_id: d for d in arun(redis_url, body)}
    assert list(got) == ids
    assert got[ids[0]].error == "malformed message: task: must be a JSON object"
    assert got[ids[1]].error.startswith("malformed message: field name b'\\xff': is not valid")
    assert got[ids[2]].task == task
    assert {row["consumer"] for row in pending(sync_redis, keys).values()} == {"worker-a"}


def test_reclaim_resumes_the_scan_where_it_stopped(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    ids = [add(sync_redis, keys, make_task(n).to_message()) for n in range(3)]

    async def body(client: Redis) -> list[list[str]]:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        await a.read(10, 100)
        for msg_id in ids:
            set_idle(sync_redis, keys, "worker-a", msg_id, 120_000)
        first = await b.reclaim(60, 2)
        second = await b.reclaim(60, 2)
        return [[d.msg_id for d in first], [d.msg_id for d in second]]

    first, second = arun(redis_url, body)
    assert len(first) == 2
    assert sorted(first + second) == sorted(ids)
    assert {row["consumer"] for row in pending(sync_redis, keys).values()} == {"worker-b"}


# -- touch -----------------------------------------------------------------------------------


def test_touch_resets_idle_time_without_counting_a_delivery(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    id1 = add(sync_redis, keys, make_task(1).to_message())
    id2 = add(sync_redis, keys, make_task(2).to_message())

    async def body(client: Redis) -> tuple[set[str], list[tuple[str, str]]]:
        a = StreamConsumer(client, keys, "worker-a")
        await a.ensure_group()
        await a.read(10, 100)
        for msg_id in (id1, id2):
            set_idle(sync_redis, keys, "worker-a", msg_id, 120_000)
        idle_before = set(pending(sync_redis, keys, idle_ms=60_000))
        return idle_before, await touch(a, [(keys.stream, id1)])

    idle_before, lost = arun(redis_url, body)
    assert idle_before == {id1, id2}
    assert lost == []
    assert set(pending(sync_redis, keys, idle_ms=60_000)) == {id2}  # id1 is fresh again
    rows = pending(sync_redis, keys)
    assert rows[id1]["times_delivered"] == 1
    assert rows[id1]["consumer"] == "worker-a"
    assert rows[id1]["time_since_delivered"] < rows[id2]["time_since_delivered"]


def test_touch_reports_entries_no_longer_ours(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    t3 = make_task(3)
    id1 = add(sync_redis, keys, make_task(1).to_message())
    id2 = add(sync_redis, keys, make_task(2).to_message())
    id3 = add(sync_redis, keys, t3.to_message())

    async def body(client: Redis) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        await a.read(10, 100)
        set_idle(sync_redis, keys, "worker-a", id2, 120_000)
        taken = await b.reclaim(60, 10)
        assert [d.msg_id for d in taken] == [id2]
        await ack(a, [(keys.stream, id3)])
        set_idle(sync_redis, keys, "worker-b", id2, 120_000)
        return await touch(a, [(keys.stream, i) for i in (id1, id2, id3)]), await touch(a, [])

    lost, none = arun(redis_url, body)
    assert sorted(lost) == sorted([(keys.stream, id2), (keys.stream, id3)])
    assert none == []
    rows = pending(sync_redis, keys)
    assert rows[id2]["consumer"] == "worker-b"  # touch did not take it back
    assert rows[id2]["time_since_delivered"] >= 120_000  # nor refresh it for its new owner
    assert rows[id1]["consumer"] == "worker-a"


# -- hand back -------------------------------------------------------------------------------


def test_hand_back_makes_entries_reclaimable_at_once_with_count_restored(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    t1, t2 = make_task(1), make_task(2)
    id1 = add(sync_redis, keys, t1.to_message())
    id2 = add(sync_redis, keys, t2.to_message())

    async def body(client: Redis) -> dict[str, Any]:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        read = {d.msg_id: d for d in await a.read(10, 100)}
        out: dict[str, Any] = {"empty": await a.hand_back([], 3600)}
        out["handed"] = await a.hand_back([read[id1]], 3600)
        out["rows"] = pending(sync_redis, keys)
        out["reclaimed"] = await b.reclaim(30, 10)
        return out

    out = arun(redis_url, body)
    assert out["empty"] == 0
    assert out["handed"] == 1
    row = out["rows"][id1]
    assert row["consumer"] == "worker-a"
    assert row["time_since_delivered"] >= 3_600_000
    assert row["times_delivered"] == 0
    assert out["rows"][id2]["time_since_delivered"] < 30_000  # not handed back
    got = out["reclaimed"]
    assert [d.msg_id for d in got] == [id1]
    assert got[0].deliveries == 1  # as before the hand-back: it used up no delivery
    assert got[0].task == t1
    assert pending(sync_redis, keys)[id1]["consumer"] == "worker-b"


def test_hand_back_of_a_reclaimed_delivery_keeps_its_count(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    msg_id = add(sync_redis, keys, make_task().to_message())

    async def body(client: Redis) -> tuple[int, list[Delivery]]:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        c = StreamConsumer(client, keys, "worker-c")
        await a.ensure_group()
        await a.read(10, 100)
        [reclaimed] = await b.reclaim(0, 10)
        assert reclaimed.deliveries == 2
        handed = await b.hand_back([reclaimed], 3600)
        return handed, await c.reclaim(30, 10)

    handed, got = arun(redis_url, body)
    assert handed == 1
    assert [(d.msg_id, d.deliveries) for d in got] == [(msg_id, 2)]


def test_hand_back_skips_entries_not_pending_on_this_consumer(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    msg_id = add(sync_redis, keys, make_task().to_message())

    async def body(client: Redis) -> int:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        [delivery] = await a.read(10, 100)
        set_idle(sync_redis, keys, "worker-a", msg_id, 120_000)
        assert len(await b.reclaim(60, 10)) == 1
        return await a.hand_back([delivery], 3600)

    assert arun(redis_url, body) == 0
    row = pending(sync_redis, keys)[msg_id]
    assert row["consumer"] == "worker-b"
    assert row["times_delivered"] == 2
    assert row["time_since_delivered"] < 3_600_000


# -- dead letters ----------------------------------------------------------------------------


def test_dead_letter_moves_task_acks_it_and_releases_its_url(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    t1, t2 = make_task(1), make_task(2)

    async def body(client: Redis) -> dict[str, Any]:
        writer = TaskWriter(client, keys)
        result = await writer.add([t1, t2])
        assert result.enqueued == 2
        seen_before = [await is_seen(writer, t1), await is_seen(writer, t2)]
        a = StreamConsumer(client, keys, "worker-a")
        await a.ensure_group()
        got = {d.task.task_id: d for d in await a.read(10, 100) if d.task is not None}
        before = time.time()
        dead_id = await a.dead_letter(got[t1.task_id], "HTTP 500, 5 times",
                                      fingerprint_bytes(t1).hex())
        return {"seen_before": seen_before, "delivery": got[t1.task_id], "dead_id": dead_id,
                "before": before, "after": time.time(),
                "seen_after": [await is_seen(writer, t1), await is_seen(writer, t2)]}

    out = arun(redis_url, body)
    assert out["seen_before"] == [True, True]
    delivery = out["delivery"]

    [(dead_id, fields)] = sync_redis.xrange(keys.dead)
    assert dead_id == out["dead_id"]
    assert fields["t"] == delivery.fields["t"]
    assert ExecTask.from_message({"v": "1", "t": fields["t"]}) == t1
    assert fields["reason"] == "HTTP 500, 5 times"
    assert fields["source_id"] == delivery.msg_id
    assert fields["consumer"] == "worker-a"
    assert fields["deliveries"] == "1"
    assert out["before"] - 1 <= float(fields["at"]) <= out["after"] + 1

    assert sync_redis.xlen(keys.stream) == 1  # only t2 is left
    assert delivery.msg_id not in pending(sync_redis, keys)
    assert pending_count(sync_redis, keys) == 1
    assert sync_redis.xrange(keys.stream, delivery.msg_id, delivery.msg_id) == []
    assert out["seen_after"] == [False, True]  # t1's URL released from dedup, t2's kept


def test_dead_letter_of_a_malformed_message_keeps_raw_fields(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    msg_id = add(sync_redis, keys, {"junk": "é", "v": "7"})
    sync_redis.sadd(keys.seen("news"), "keep-me")

    async def body(client: Redis) -> Delivery:
        a = StreamConsumer(client, keys, "worker-a")
        await a.ensure_group()
        [delivery] = await a.read(10, 100)
        await a.dead_letter(delivery, delivery.error, "keep-me")
        return delivery

    delivery = arun(redis_url, body)
    assert delivery.task is None
    [(_, fields)] = sync_redis.xrange(keys.dead)
    assert json.loads(fields["t"]) == {"junk": "é", "v": "7"}
    assert fields["reason"] == delivery.error
    assert fields["source_id"] == msg_id
    assert sync_redis.xlen(keys.stream) == 0
    assert pending_count(sync_redis, keys) == 0
    assert sync_redis.smembers(keys.seen("news")) == {"keep-me"}


def test_dead_letter_keeps_an_oversized_message_whole(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    big = "é".encode() + b"\xff" + b"x" * (3 * MAX_MESSAGE_BYTES)
    fields = {b"v": b"1", b"t": big}
    msg_id = raw_client(redis_url).xadd(keys.stream, fields).decode()

    async def body(client: Redis) -> tuple[Delivery, str]:
        a = StreamConsumer(client, keys, "worker-a")
        await a.ensure_group()
        [delivery] = await a.read(10, 100)
        return delivery, await a.dead_letter(delivery, delivery.error)

    delivery, dead_id = arun(redis_url, body)
    assert delivery.error == (f"malformed message: task: is larger than {MAX_MESSAGE_BYTES} "
                              f"bytes ({len(big)})")
    [(entry_id, dead)] = sync_redis.xrange(keys.dead)
    assert entry_id == dead_id
    assert dead["reason"] == delivery.error and dead["source_id"] == msg_id
    assert len(dead["t"]) > 3 * MAX_MESSAGE_BYTES  # not cut to 64 KiB
    restored = {k.encode(): v.encode("utf-8", "surrogateescape")
                for k, v in json.loads(dead["t"]).items()}
    assert restored == fields
    assert sync_redis.xlen(keys.stream) == 0 and pending_count(sync_redis, keys) == 0


def test_dead_letter_is_refused_once_another_consumer_reclaimed_the_entry(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    task = make_task(1)

    async def body(client: Redis) -> tuple[str, list[Delivery], bool]:
        writer = TaskWriter(client, keys)
        await writer.add([task])
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        [held] = await a.read(10, 100)
        taken = await b.reclaim(0, 10)  # A looked dead to B
        refused = await a.dead_letter(held, "HTTP 500, 5 times", fingerprint_bytes(task).hex())
        return refused, taken, await is_seen(writer, task)

    refused, taken, still_seen = arun(redis_url, body)
    assert refused == ""
    assert sync_redis.xlen(keys.dead) == 0  # no dead letter written
    [row] = pending(sync_redis, keys).values()
    assert row["consumer"] == "worker-b" and row["message_id"] == taken[0].msg_id
    assert sync_redis.xlen(keys.stream) == 1  # still there, for B to complete
    assert still_seen  # the URL was not released either


def test_dead_letter_is_refused_for_an_entry_already_acked(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    add(sync_redis, keys, {"junk": "1"})

    async def body(client: Redis) -> str:
        a = StreamConsumer(client, keys, "worker-a")
        await a.ensure_group()
        [delivery] = await a.read(10, 100)
        await ack(a, [delivery.ref])
        return await a.dead_letter(delivery, delivery.error)

    assert arun(redis_url, body) == ""
    assert sync_redis.xlen(keys.dead) == 0


# -- failure notes, quiet, durability ---------------------------------------------------------


def test_note_failures_and_failure_notes_round_trip(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    t1, t2, t3 = (make_task(n) for n in range(3))

    async def body(client: Redis) -> tuple[dict[str, str], dict[str, str]]:
        a = TaskRecords(client, keys)
        await a.note_failures([(t1, "callback raised KeyError"), (t2, "x" * 5000)], 120)
        await a.note_failures([], 120)
        return await a.failure_notes([t1, t2, t3]), await a.failure_notes([])

    notes, empty = arun(redis_url, body)
    assert notes == {t1.task_id: "callback raised KeyError", t2.task_id: "x" * 2000}
    assert empty == {}
    assert 0 < sync_redis.ttl(keys.failed(t1.task_id)) <= 120


def test_namespace_quiet(redis_url: str, keys: KeyLayout, sync_redis: redis.Redis) -> None:
    task = make_task()

    async def body(client: Redis) -> list[bool]:
        a = StreamConsumer(client, keys, "worker-a")
        group = ConsumerGroup(client, keys, "worker-a")
        states = [await group.namespace_quiet()]  # no stream at all
        await a.ensure_group()
        states.append(await group.namespace_quiet())  # empty stream
        msg_id = add(sync_redis, keys, task.to_message())
        states.append(await group.namespace_quiet())  # waiting
        await a.read(10, 100)
        states.append(await group.namespace_quiet())  # pending
        await ack(a, [(keys.stream, msg_id)])
        states.append(await group.namespace_quiet())  # acked and deleted
        return states

    assert arun(redis_url, body) == [True, True, False, False, True]


def test_check_durability_warnings(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis
) -> None:
    # The test server runs with --save "" and appendonly no: persistence is off.
    assert sync_redis.config_get("appendonly")["appendonly"] == "no"
    original_save = sync_redis.config_get("save")["save"]
    assert original_save == ""

    def check() -> list[str]:
        return arun(redis_url, lambda c: ConsumerGroup(c, keys, "w").check_durability())

    try:
        sync_redis.config_set("maxmemory-policy", "noeviction")
        warnings = check()
        assert len(warnings) == 1
        assert "persistence is off" in warnings[0]

        sync_redis.config_set("maxmemory-policy", "allkeys-lru")
        warnings = check()
        assert len(warnings) == 2
        assert any("allkeys-lru" in w and "noeviction" in w for w in warnings)

        sync_redis.config_set("save", "3600 1")  # RDB save points: persistence is on
        warnings = check()
        assert len(warnings) == 1
        assert "allkeys-lru" in warnings[0]

        sync_redis.config_set("maxmemory-policy", "noeviction")
        assert check() == []
    finally:
        sync_redis.config_set("maxmemory-policy", "noeviction")
        sync_redis.config_set("save", original_save)


def test_consumers_holding_nothing_leave_and_long_gone_ones_are_pruned(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    for n in range(2):
        add(sync_redis, keys, make_task(n).to_message())
    sync_redis.xreadgroup(GROUP, "holder", {keys.stream: ">"}, count=1)  # holds one entry
    sync_redis.xreadgroup(GROUP, "gone", {keys.stream: ">"}, count=1)
    (gone_id,) = [i for i, row in pending(sync_redis, keys).items() if row["consumer"] == "gone"]
    sync_redis.xack(keys.stream, GROUP, gone_id)  # "gone" holds nothing now
    wait_for(lambda: all(c["idle"] > 100 for c in sync_redis.xinfo_consumers(keys.stream, GROUP)
                         if c["name"] == "gone"), timeout=10, interval=0.02)

    def names() -> set[str]:
        return {c["name"] for c in sync_redis.xinfo_consumers(keys.stream, GROUP)}

    async def body(client: Redis) -> tuple[list[str], list[str], int, int]:
        me = StreamConsumer(client, keys, "me")
        await me.ensure_group()
        await me.read(10, 0)  # "me" exists now, holding nothing
        group = ConsumerGroup(client, keys, "me")
        kept = await group.prune(60)  # nobody was gone that long
        pruned = await group.prune(0.05)  # "gone" only: "holder" holds an entry, "me" is live
        holder = ConsumerGroup(client, keys, "holder")
        return kept, pruned, await group.leave(), await holder.leave()

    kept, pruned, me_left, holder_left = arun(redis_url, body)
    assert (kept, pruned) == ([], ["gone"])
    assert me_left == len(keys.streams)  # it read every lane stream, holds nothing
    assert holder_left == len(keys.streams) - 1  # not the stream where it holds an entry
    assert names() == {"holder"}

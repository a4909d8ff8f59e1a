"""Poison messages in the task streams: whatever a message holds, decoding it never raises out of
``read()`` or ``reclaim()``; a malformed one is dead-lettered alone, whole, with a reason, and the
rest of its batch is delivered. Named nasty cases, a Hypothesis property over arbitrary field maps
(both against a real Redis), a real worker among good tasks, and stream shards on a cluster.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delivery import Delivery
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client, sync_client
from meteorseed_scrapy.task.exec_task import MAX_DEPTH, MAX_MESSAGE_BYTES, ExecTask
from meteorseed_scrapy.testing.cluster import LocalCluster
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import RedisServer
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker, stored_docs
from tests.queue_helpers import ack

Pairs = list[tuple[bytes, bytes]]

BASE = {"task_id": "t1", "seed_id": "s1", "site_id": "news", "url": "https://example.com/a"}


def task_json(**changes: Any) -> bytes:
    return json.dumps({**BASE, **changes}).encode()


def nested(depth: int, leaf: str = "x") -> str:
    return '{"a":' * depth + json.dumps(leaf) + "}" * depth


def message(t: bytes) -> Pairs:
    return [(b"v", b"1"), (b"t", t)]


#: (name, the entry's fields as stored, what the reason must say)
NASTY: list[tuple[str, Pairs, str]] = [
    ("deep JSON", message(b"[" * 30000 + b"]" * 30000), "task: must be a JSON object"),
    ("deep meta", message(b'{"task_id":"t1","seed_id":"s","site_id":"news","url":'
                          b'"https://e.com/","meta":' + nested(300).encode() + b"}"),
     f"nests deeper than {MAX_DEPTH} levels"),
    ("deep task_id", message(task_json(task_id=json.loads("[" * 500 + "]" * 500))),
     "task_id" + "[0]" * MAX_DEPTH + ": nests deeper than"),
    ("t not UTF-8", message(task_json().replace(b"/a", b"/\xe9")), "t: is not valid UTF-8"),
    ("v not UTF-8", [(b"v", b"\xc3"), (b"t", task_json())], "v: is not valid UTF-8"),
    ("name not UTF-8", [(b"v", b"1"), (b"t\xff", task_json())],
     "field name b't\\xff': is not valid UTF-8"),
    ("lone surrogate in url", message(task_json().replace(b"/a", b"/\\ud800")),
     "url: is not valid UTF-8 (lone surrogate"),
    ("lone surrogate in meta key", message(b'{"task_id":"t1","seed_id":"s","site_id":"n",'
                                           b'"url":"https://e.com/","meta":{"\\udfff":1}}'),
     "meta.'\\udfff': is not valid UTF-8"),
    ("no v", [(b"t", task_json())], "v: unsupported message version None"),
    ("no t", [(b"v", b"1")], "t: is missing"),
    ("v 2", [(b"v", b"2"), (b"t", task_json())], "v: unsupported message version '2'"),
    ("extra field", [*message(task_json()), (b"trace", b"x")],
     "trace: is not a field of a task message"),
    ("t twice", [*message(task_json()), (b"t", task_json(url="https://evil.example/"))],
     "t: appears more than once"),
    ("url twice in t", message(task_json()[:-1] + b', "url": "https://evil.example/"}'),
     "url: appears more than once in its object"),
    ("meta key twice", message(task_json()[:-1] + b', "meta": {"k": 1, "k": 2}}'),
     "meta.k: appears more than once in its object"),
    ("over the size limit", message(task_json(meta={"pad": "x" * MAX_MESSAGE_BYTES})),
     f"task: is larger than {MAX_MESSAGE_BYTES} bytes"),
    ("empty t", message(b""), "t: is not valid JSON"),
    ("list", message(b"[1,2]"), "task: must be a JSON object"),
    ("string", message(b'"https://example.com/"'), "task: must be a JSON object"),
    ("null", message(b"null"), "task: must be a JSON object"),
    ("task_id a number", message(task_json(task_id=5)), "task_id: must be a non-empty string"),
    ("headers a list", message(task_json(headers=["a"])), "headers: must be an object"),
    ("meta a string", message(task_json(meta="m")), "meta: must be an object"),
    ("priority a string", message(task_json(priority="1")), "priority: must be an integer"),
    ("priority true", message(task_json(priority=True)), "priority: must be an integer"),
    ("priority huge", message(task_json(priority=10**30)),
     "priority: is an integer out of the 64-bit range"),
    ("5000 digits", message(task_json().replace(b'"t1"', b'"t1","priority":' + b"9" * 5000)),
     "t: is not valid JSON"),
    ("created_at 1e999", message(task_json().replace(b"}", b',"created_at":1e999}')),
     "created_at: is not a finite number (inf)"),
    ("created_at NaN", message(task_json(created_at=float("nan"))),
     "created_at: is not a finite number (nan)"),
    ("meta NaN", message(task_json(meta={"x": [float("-inf")]})),
     "meta.x[0]: is not a finite number (-inf)"),
    ("unknown task field", message(task_json(pickle="x")),
     "pickle: is not an exec task field (expected body, body_b64, callback"),
    ("url not canonical", message(task_json(url="http://[::1/")), "url: cannot be canonicalised"),
    ("url not http", message(task_json(url="file:///etc/passwd")),
     "url: must be an http(s) or data: URL"),
]


def stored_pairs(payload: str) -> Pairs:
    """A malformed message's dead-letter payload back to its fields, byte for byte."""
    pairs = json.loads(payload, object_pairs_hook=lambda p: p)
    return [(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape"))
            for k, v in pairs]


def xadd(raw: redis.Redis, stream: str, pairs: Pairs) -> str:
    """XADD the pairs as they are (a name may repeat, as XADD allows)."""
    flat = [part for pair in pairs for part in pair]
    return str(raw.execute_command("XADD", stream, "*", *flat).decode())


def good_task(n: int) -> ExecTask:
    return ExecTask.create(seed_id="s1", site_id="news", url=f"https://example.com/good/{n}")


async def settle(consumer: StreamConsumer, deliveries: list[Delivery]) -> None:
    """What a worker does: ack the tasks (as if done), dead-letter the malformed messages."""
    for d in deliveries:
        if d.task is None:
            assert await consumer.dead_letter(d, d.error)
        else:
            await ack(consumer, [d.ref])


def run_batch(url: str, keys: KeyLayout, entries: list[Pairs], via_reclaim: bool
              ) -> list[Delivery]:
    """Add ``entries``, then read them (or reclaim them from a dead worker) and settle them."""
    raw = redis.Redis.from_url(url)
    try:
        raw.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
        for pairs in entries:
            xadd(raw, keys.stream, pairs)
        if via_reclaim:
            raw.xreadgroup(GROUP, "ghost", {keys.stream: ">"})
    finally:
        raw.close()

    async def body() -> list[Delivery]:
        client = Redis.from_url(url, decode_responses=True)  # as the worker's
        try:
            consumer = StreamConsumer(client, keys, "worker-a")
            await consumer.ensure_group()
            got: list[Delivery] = []
            while len(got) < len(entries):
                batch = await (consumer.reclaim(0, 7) if via_reclaim else consumer.read(7, 0))
                assert batch, f"{len(entries) - len(got)} entries never delivered"
                got += batch
            await settle(consumer, got)
            return got
        finally:
            await client.aclose()

    return asyncio.run(body())


def check_settled(sync_redis: redis.Redis, keys: KeyLayout, entries: list[Pairs],
                  got: list[Delivery]) -> None:
    """Every entry delivered once, in order; every malformed one dead-lettered whole with its
    reason; none left in the stream or pending."""
    assert len(got) == len(entries)
    letters = [fields for _, fields in sync_redis.xrange(keys.dead)]
    bad = [(pairs, d) for pairs, d in zip(entries, got, strict=True) if d.task is None]
    assert len(letters) == len(bad)
    for (pairs, d), letter in zip(bad, letters, strict=True):
        assert letter["reason"] == d.error and d.error.startswith("malformed message: ")
        assert letter["source_id"] == d.msg_id
        assert stored_pairs(letter["t"]) == pairs
    assert sync_redis.xlen(keys.stream) == 0
    assert int(sync_redis.xpending(keys.stream, GROUP)["pending"]) == 0


@pytest.fixture
def keys(namespace: str) -> KeyLayout:
    return KeyLayout(namespace)


@pytest.mark.parametrize(("name", "pairs", "needle"), NASTY, ids=[n for n, _, _ in NASTY])
def test_nasty_message_is_refused_with_a_reason(name: str, pairs: Pairs, needle: str) -> None:
    delivery = Delivery.decode("ns:tasks", "1-0", pairs, 1)
    assert delivery.task is None
    assert needle in delivery.error, delivery.error
    assert stored_pairs(delivery.dead_payload) == pairs


@pytest.mark.parametrize("via_reclaim", [False, True], ids=["read", "reclaim"])
def test_nasty_messages_among_good_ones_are_each_dead_lettered_alone(
    redis_url: str, keys: KeyLayout, sync_redis: redis.Redis, via_reclaim: bool
) -> None:
    goods = [good_task(n) for n in range(len(NASTY) + 1)]
    entries: list[Pairs] = [message(goods[0].to_message()["t"].encode())]
    for (_, pairs, _), task in zip(NASTY, goods[1:], strict=True):
        entries += [pairs, message(task.to_message()["t"].encode())]

    got = run_batch(redis_url, keys, entries, via_reclaim)
    assert [d.task for d in got if d.task is not None] == goods
    reasons = [d.error for d in got if d.task is None]
    for (name, _, needle), reason in zip(NASTY, reasons, strict=True):
        assert needle in reason, (name, reason)
    check_settled(sync_redis, keys, entries, got)


# -- the property: any field map at all ------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=12,
)
_task_like = st.fixed_dictionaries(
    {"task_id": st.just("t1") | st.sampled_from(["t1", "", " "]) | _json,
     "seed_id": st.just("s1"), "site_id": st.sampled_from(["news", "x" * 300]),
     "url": st.sampled_from(["https://example.com/", "http://[::1/", "ftp://x/",
                             "https://example.com/\udc80"]) | st.text(max_size=20)},
    optional={"meta": _json, "headers": _json, "priority": st.integers() | st.floats(),
              "created_at": st.floats() | st.integers(), "method": st.text(max_size=5),
              "lane": st.text(max_size=9), "retry_count": st.integers(), "zz": _json},
)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # lone surrogates as CESU bytes: not UTF-8


def _with_invalid_byte(data: bytes, at: int, byte: int) -> bytes:
    at = at % (len(data) + 1)
    return data[:at] + bytes([byte]) + data[at:]


_t_values = st.one_of(
    _task_like.map(lambda d: _utf8(json.dumps(d, ensure_ascii=False))),
    _task_like.map(lambda d: json.dumps(d).encode()),
    _json.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=80),
    st.integers(1, 40000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(0, 3 * MAX_MESSAGE_BYTES).map(lambda n: task_json(meta={"p": "x" * n})),
    st.builds(_with_invalid_byte, st.just(task_json()), st.integers(0, 200),
              st.integers(0x80, 0xFF)),
)
_names = st.sampled_from([b"v", b"t"]) | st.binary(min_size=0, max_size=6)
_field_maps = st.one_of(
    st.dictionaries(_names, st.binary(max_size=40) | _t_values, min_size=1, max_size=4),
    st.builds(lambda v, t, extra: {b"v": v, b"t": t, **extra},
              st.just(b"1") | st.just(b"1") | st.binary(max_size=3), _t_values,
              st.just({}) | st.dictionaries(_names, st.binary(max_size=10), max_size=1)),
)


def _kind(error: str) -> str:
    """A refusal's kind: its problem without the value it quotes."""
    problem = error.removeprefix("malformed message: ").partition(": ")[2]
    return re.split(r"[\"'(,]| got", problem)[0].strip()


@pytest.fixture(scope="module")
def fuzz_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(maps=st.lists(_field_maps, min_size=1, max_size=4), via_reclaim=st.booleans())
def test_any_field_map_is_delivered_or_dead_lettered(
    fuzz_redis: RedisServer, maps: list[dict[bytes, bytes]], via_reclaim: bool
) -> None:
    keys = KeyLayout(f"f{uuid.uuid4().hex[:12]}")
    good = message(good_task(0).to_message()["t"].encode())
    entries = [good, *[list(m.items()) for m in maps], good]
    got = run_batch(fuzz_redis.url, keys, entries, via_reclaim)
    # A task only from exactly v=1 and t in UTF-8: never from a replaced byte or a stray field.
    for pairs, d in zip(entries, got, strict=True):
        # (seen with --hypothesis-show-statistics: which refusals the examples reached)
        event("a task" if d.task else _kind(d.error))
        if d.task is not None:
            assert sorted(k for k, _ in pairs) == [b"t", b"v"] and dict(pairs)[b"v"] == b"1"
            assert ExecTask.from_message({"v": "1", "t": dict(pairs)[b"t"].decode()}) == d.task
    assert got[0].task is not None and got[-1].task is not None
    sync = redis.Redis.from_url(fuzz_redis.url, decode_responses=True)
    try:
        check_settled(sync, keys, entries, got)
    finally:
        for key in sync.scan_iter(f"{keys.namespace}:*"):
            sync.delete(key)
        sync.close()


# -- a real worker among poison messages -----------------------------------------------------


@pytest.mark.e2e
def test_worker_dead_letters_poison_and_stores_every_good_task(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite
) -> None:
    keys = KeyLayout(namespace)
    raw = redis.Redis.from_url(redis_url)
    raw.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_IDLE_CLOSE=3)
    # Once the worker waits in its blocking read, half the poison arrives.
    wait_for(lambda: any(c.get("cmd") == "xread" for c in sync_redis.client_list()),
             timeout=60)
    sent = {xadd(raw, keys.stream, pairs): (pairs, needle) for _, pairs, needle in NASTY[::2]}
    urls = [f"{demo_site.url}/news/article/{i}" for i in range(1, 41)]
    enqueue(redis_url, namespace, urls[:20])
    sent.update({xadd(raw, keys.stream, pairs): (pairs, needle)
                 for _, pairs, needle in NASTY[1::2]})
    enqueue(redis_url, namespace, urls[20:])
    raw.close()
    assert worker.wait(180) == 0, worker.log()[-3000:]  # it stopped by itself (IDLE_CLOSE)

    assert set(stored_docs(tmp_path / "items.db")) == {
        f"probe:/news/article/{i}" for i in range(1, 41)}
    letters = {fields["source_id"]: fields for _, fields in sync_redis.xrange(keys.dead)}
    assert set(letters) == set(sent)  # each poison message, and nothing else
    for msg_id, (pairs, needle) in sent.items():
        assert needle in letters[msg_id]["reason"], letters[msg_id]["reason"]
        assert stored_pairs(letters[msg_id]["t"]) == pairs
    assert sync_redis.xlen(keys.stream) == 0
    assert int(sync_redis.xpending(keys.stream, GROUP)["pending"]) == 0


# -- a Redis Cluster with stream shards ------------------------------------------------------


def test_poison_on_a_cluster_is_read_reclaimed_and_dead_lettered_by_its_owner(
    cluster: LocalCluster, ns: str
) -> None:
    """Each shard's stream gets a poison message while read() blocks (on one shard): the
    blocked read and the later one deliver all three, another consumer reclaims them, the
    first one's dead letters are refused, the owner's are written, whole, in each shard."""
    keys = KeyLayout(ns, 3, cluster=True)
    poison = dict((name, pairs) for name, pairs, _ in NASTY)["t twice"]
    raw = sync_client(cluster.url)
    nodes = [redis.Redis(port=port) for port in cluster.ports]

    def blocked() -> bool:
        return any(c.get("cmd") == "xread" for node in nodes for c in node.client_list())

    async def body(client: Any) -> tuple[list[Delivery], list[Delivery], list[str], list[str]]:
        a = StreamConsumer(client, keys, "worker-a")
        b = StreamConsumer(client, keys, "worker-b")
        await a.ensure_group()
        reading = asyncio.ensure_future(a.read(10, 30_000))
        for _ in range(400):  # until it waits in XREAD (polled, at most 20 s)
            if blocked():
                break
            await asyncio.sleep(0.05)
        for shard in keys.shard_keys:
            xadd(raw, shard.stream, poison)
        got = await asyncio.wait_for(reading, 20)
        while len(got) < 3:
            got += await a.read(10, 0)
        taken = await b.reclaim(0, 10)
        refused = [await a.dead_letter(d, d.error) for d in got]
        written = [await b.dead_letter(d, d.error) for d in taken]
        return got, taken, refused, written

    async def main() -> Any:
        client = async_client(cluster.url, decode_responses=True)
        try:
            return await body(client)
        finally:
            await client.aclose()

    try:
        got, taken, refused, written = asyncio.run(main())
        assert [d.error for d in got] == ["malformed message: t: appears more than once in "
                                          "the message"] * 3
        assert sorted(d.ref for d in taken) == sorted(d.ref for d in got)
        assert refused == ["", "", ""] and all(written)
        for shard in keys.shard_keys:
            [(_, letter)] = raw.xrange(shard.dead)
            assert letter[b"consumer"] == b"worker-b"
            assert stored_pairs(letter[b"t"].decode()) == poison
            assert raw.xlen(shard.stream) == 0
            assert int(raw.xpending(shard.stream, GROUP)["pending"]) == 0
    finally:
        raw.close()
        for node in nodes:
            node.close()

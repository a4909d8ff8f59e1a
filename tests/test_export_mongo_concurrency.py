"""``meteorseed export`` on MongoDB never skips a document written concurrently
(store/mongo_export.py): writers reserve change sequences as *in flight*, an export reads only
below the lowest one still in flight.

mongomock-ng by default; a real server too when ``METEORSEED_TEST_MONGO_URL`` is set.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import mongomock_ng
import pytest

from meteorseed_scrapy.store import mongo_export
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.mongo import MongoStore

MONGO_ENV = "METEORSEED_TEST_MONGO_URL"


@pytest.fixture(params=["mongomock", "mongodb"])
def mongo_uri(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "mongomock":
        _one_operation_at_a_time(monkeypatch)
        yield f"mongomock://{uuid.uuid4().hex}/testdb"
        return
    base = os.environ.get(MONGO_ENV)
    if not base:
        pytest.skip(f"no real MongoDB: set {MONGO_ENV}=mongodb://host:port to run this back end")
    parts = urlsplit(base)
    database = f"meteorseed_test_{uuid.uuid4().hex[:10]}"
    yield urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(base, serverSelectionTimeoutMS=5000)
    client.drop_database(database)
    client.close()


def _one_operation_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """mongomock-ng is not thread-safe (two updates of one document at once corrupt it): each
    operation the store and the export make runs alone, as a server applies it atomically;
    threads still interleave between operations, where the export's races are."""
    lock = threading.RLock()

    def alone(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return fn(*args, **kwargs)
        return call

    for name in ("reserve_sequence", "release_sequence", "export_bound", "export_docs"):
        monkeypatch.setattr(mongo_export, name, alone(getattr(mongo_export, name)))
    monkeypatch.setattr(mongomock_ng.Collection, "bulk_write",
                        alone(mongomock_ng.Collection.bulk_write))


def _doc(key: str, version: str) -> dict[str, Any]:
    return {"_id": f"news:{key}", "site_id": "news", "seed_id": "s", "task_id": "t",
            "url": f"https://news.example/{key}", "v": version,
            "first_seen_at": "2026-01-01T00:00:00.000000Z",
            "updated_at": "2026-01-01T00:00:00.000000Z"}


def _held_writes(monkeypatch: pytest.MonkeyPatch, hold: Callable[[], None]) -> None:
    """Every items write calls ``hold()`` between its sequence's reservation and its
    ``bulk_write``."""
    real = mongo_export.released_after

    @contextmanager
    def held(database: Any, namespace: str, sequence: int | None) -> Iterator[None]:
        if sequence is not None:
            hold()
        with real(database, namespace, sequence):
            yield

    monkeypatch.setattr(mongo_export, "released_after", held)


def test_a_batch_still_writing_holds_the_export_below_it(
        mongo_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Batch 1 reserved its sequence first and is still writing; batch 2 (a later sequence) is
    # committed. An export must not pass batch 2, or batch 1 would never be exported.
    started, go = threading.Event(), threading.Event()

    def hold() -> None:
        if threading.current_thread().name == "slow":
            started.set()
            go.wait(30)

    _held_writes(monkeypatch, hold)
    slow, fast, reader = (open_store(mongo_uri, "ns") for _ in range(3))
    try:
        writer = threading.Thread(target=slow.upsert_many, args=([_doc("early", "1")],),
                                  name="slow")
        writer.start()
        assert started.wait(30)
        fast.upsert_many([_doc("late", "2")])
        assert reader.export_page(None, 10) == []  # held below batch 1
        go.set()
        writer.join(30)
        got = reader.export_page(None, 10)
        assert [d["_id"] for _, d in got] == ["news:early", "news:late"]
    finally:
        go.set()
        for store in (slow, fast, reader):
            store.close()


@pytest.mark.parametrize("seed", range(6))
def test_concurrent_writers_and_a_resuming_exporter_never_skip(
        mongo_uri: str, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Four writers upsert batches of documents drawn from a small pool (so documents are
    # rewritten), each batch held for a random moment between its reservation and its write;
    # an exporter resumes from its cursor in random page sizes meanwhile. Every document's last
    # version must have been exported at least once.
    rng = random.Random(seed)
    delays = [rng.uniform(0, 0.003) for _ in range(400)]
    turn = iter(range(10**9))

    def hold() -> None:
        threading.Event().wait(delays[next(turn) % len(delays)])  # (perturbs the interleaving)

    _held_writes(monkeypatch, hold)
    writers = [open_store(mongo_uri, "ns") for _ in range(4)]
    reader = open_store(mongo_uri, "ns")
    batches = [[_doc(f"k{rng.randrange(40)}", f"{w}.{b}.{i}") for i in range(rng.randint(1, 5))]
               for w in range(4) for b in range(15)]
    done = threading.Event()
    seen: set[tuple[str, str]] = set()
    sizes = [rng.randint(1, 7) for _ in range(50)]

    def write(w: int) -> None:
        for batch in batches[w * 15:(w + 1) * 15]:
            writers[w].upsert_many(batch)

    def export_until_done() -> None:
        cursor: Any = None
        i = 0
        while True:
            finished = done.is_set()  # (read first: a last pass after every write ended)
            page = reader.export_page(cursor, sizes[i % len(sizes)])
            i += 1
            seen.update((d["_id"], d["v"]) for _, d in page)
            if page:
                cursor = page[-1][0]
            elif finished:
                return

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    exporter = threading.Thread(target=export_until_done)
    try:
        exporter.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        done.set()
        exporter.join(120)
        assert not exporter.is_alive()
        final = {d["_id"]: d["v"] for d in reader.iter_docs()}  # type: ignore[attr-defined]
        missing = {i: v for i, v in final.items() if (i, v) not in seen}
        assert not missing, f"skipped by the export: {missing}"
    finally:
        for store in (*writers, reader):
            store.close()


def test_a_dead_writers_sequence_holds_the_export_until_it_times_out(
        mongo_uri: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(mongo_uri, "ns")
    assert isinstance(store, MongoStore)
    try:
        store.upsert_many([_doc("a", "1")])
        mongo_export.reserve_sequence(store.database, "ns")  # a writer that dies here
        store.upsert_many([_doc("b", "1")])
        assert [d["_id"] for _, d in store.export_page(None, 10)] == ["news:a"]
        monkeypatch.setattr(mongo_export, "IN_FLIGHT_TIMEOUT_S", -1.0)
        with caplog.at_level(logging.WARNING, logger=mongo_export.__name__):
            got = store.export_page(None, 10)
        assert [d["_id"] for _, d in got] == ["news:a", "news:b"]
        assert "never released" in caplog.text
        monkeypatch.setattr(mongo_export, "IN_FLIGHT_TIMEOUT_S", 600.0)
        assert len(store.export_page(None, 10)) == 2  # (dropped: it holds nothing any more)
    finally:
        store.close()


def test_a_counter_from_before_in_flight_values_is_taken_as_is() -> None:
    # A namespace written by an older version: its counter has no ``inflight``.
    store = open_store(f"mongomock://{uuid.uuid4().hex}/testdb", "ns")
    assert isinstance(store, MongoStore)
    try:
        store.database["ns.sequences"].insert_one({"_id": "items", "n": 41})
        store.upsert_many([_doc("a", "1")])
        ((position, _),) = store.export_page(None, 10)
        assert position == (42, "news:a")
    finally:
        store.close()

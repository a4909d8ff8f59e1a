"""One contract, every store: SQLite, a real PostgreSQL (started by the tests, skipped where it
is not installed), mongomock-ng, and a real MongoDB when ``METEORSEED_TEST_MONGO_URL`` is set
(e.g. ``mongodb://127.0.0.1:27017``)."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from meteorseed_scrapy.store import sqlite as sqlite_module
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.base import DEFAULT_NAMESPACE, Store, StoreUnavailable
from meteorseed_scrapy.store.documents import (
    DocumentError,
    build_document,
    check_fields,
    last_wins,
    utc_timestamp,
)
from meteorseed_scrapy.store.mongo import MongoStore
from meteorseed_scrapy.testing.polling import wait_for
from tests.store_helpers import all_ids, count_by_site

MONGO_ENV = "METEORSEED_TEST_MONGO_URL"
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)

Opener = Callable[..., Store]


def _real_mongo_uri() -> Iterator[str]:
    base = os.environ.get(MONGO_ENV)
    if not base:
        pytest.skip(f"no real MongoDB: set {MONGO_ENV}=mongodb://host:port to run this back end")
    parts = urlsplit(base)
    database = f"meteorseed_test_{uuid.uuid4().hex[:10]}"
    uri = urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))
    yield uri
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(base, serverSelectionTimeoutMS=5000)
    client.drop_database(database)
    client.close()


@pytest.fixture(params=["sqlite", "postgres", "mongomock", "mongodb"])
def open_(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a store (a new connection each call) on one fresh database for this test."""
    if request.param == "sqlite":
        uris: Iterator[str] = iter([f"sqlite:///{tmp_path}/items.db"])
    elif request.param == "postgres":
        uris = iter([request.getfixturevalue("postgres_uri")])
    elif request.param == "mongomock":
        uris = iter([f"mongomock://{uuid.uuid4().hex}/testdb"])
    else:
        uris = _real_mongo_uri()
    uri = next(uris)
    opened: list[Store] = []

    def opener(namespace: str = DEFAULT_NAMESPACE, retention: float | None = None) -> Store:
        store = open_store(uri, namespace, retention)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()
    next(uris, None)  # runs the real-MongoDB clean-up


@pytest.fixture
def store(open_: Opener) -> Store:
    return open_()


def doc(key: str, site: str = "news", at: datetime = T0, task: str = "t1", **fields: Any) -> dict:
    return build_document(
        check_fields(fields),
        site_id=site,
        url=f"https://{site}.example/{key}",
        seed_id="seed1",
        task_id=task,
        unique_key=key,
        now=at,
    )


def test_insert_then_read(store: Store) -> None:
    written = doc("a", title="Hello", tags=["x", "y"], nested={"n": 1.5, "big": 2**53 + 1})
    store.upsert_many([written])
    got = store.get("news:a")
    assert got == written
    assert got["site_id"] == "news" and got["seed_id"] == "seed1" and got["task_id"] == "t1"
    assert got["url"] == "https://news.example/a"
    assert got["updated_at"] == got["first_seen_at"] == "2024-01-01T00:00:00.000000Z"
    assert store.count() == 1
    assert all_ids(store) == {"news:a"}
    assert store.get("news:missing") is None


def test_values_round_trip_exactly(store: Store) -> None:
    written = doc("u", text='héllo ✓ "quoted" \\', dollar="$not.a.path", empty={}, none=None)
    store.upsert_many([written])
    assert store.get("news:u") == written


def test_upsert_replaces_fields_and_keeps_first_seen_at(store: Store) -> None:
    store.upsert_many([doc("a", title="old", body="gone soon", at=T0, task="t1")])
    later = T0 + timedelta(hours=1)
    store.upsert_many([doc("a", title="new", at=later, task="t2")])
    got = store.get("news:a")
    assert got is not None
    assert got["title"] == "new"
    assert "body" not in got
    assert got["first_seen_at"] == utc_timestamp(T0)
    assert got["updated_at"] == utc_timestamp(later)
    assert got["task_id"] == "t2"
    assert store.count() == 1


def test_batch_with_duplicates_last_wins(store: Store) -> None:
    batch = [doc(f"k{i}", n=i, at=T0) for i in range(200)]
    # 50 later versions of keys already in the same batch, each with fewer fields.
    batch += [doc(f"k{i}", version=2, at=T0 + timedelta(seconds=i)) for i in range(0, 200, 4)]
    assert len(batch) == 250
    store.upsert_many(batch)
    assert store.count() == 200
    for i in range(200):
        got = store.get(f"news:k{i}")
        assert got is not None
        if i % 4 == 0:
            assert got.get("version") == 2 and "n" not in got
            assert got["updated_at"] == utc_timestamp(T0 + timedelta(seconds=i))
        else:
            assert got["n"] == i
        assert got["first_seen_at"] == utc_timestamp(T0)


def test_large_batch_crosses_sqlite_chunks(store: Store) -> None:
    count = sqlite_module.CHUNK_ROWS * 2 + 7
    store.upsert_many([doc(f"k{i}", n=i) for i in range(count)])
    assert store.count() == count
    assert store.get(f"news:k{count - 1}") == doc(f"k{count - 1}", n=count - 1)


def test_count_by_site(store: Store) -> None:
    assert count_by_site(store) == {}
    store.upsert_many([doc(f"a{i}", site="alpha") for i in range(3)])
    store.upsert_many([doc(f"b{i}", site="beta") for i in range(5)] + [doc("a0", site="alpha")])
    assert count_by_site(store) == {"alpha": 3, "beta": 5}


def test_replay_is_idempotent_across_connections(open_: Opener) -> None:
    batch = [doc(f"k{i}", n=i) for i in range(30)]
    first = open_()
    first.upsert_many(batch)
    before = list(first.iter_docs())
    first.close()
    second = open_()
    second.upsert_many(batch)
    second.upsert_many(batch)
    assert second.count() == 30
    assert list(second.iter_docs()) == before


def test_empty_batch_is_a_no_op(store: Store) -> None:
    store.upsert_many([])
    assert store.count() == 0


# -- SQLite: several processes, one file --------------------------------------------------


def _sqlite_writer(uri: str, worker: int, batches: int, size: int, barrier: Any) -> None:
    store = open_store(uri)
    barrier.wait()
    for b in range(batches):
        docs = [doc(f"w{worker}-{b}-{i}", worker=worker) for i in range(size)]
        docs += [doc(f"shared-{i}", worker=worker, batch=b) for i in range(5)]
        store.upsert_many(docs)
    store.close()


def test_sqlite_concurrent_processes_lose_nothing(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/shared.db"
    workers, batches, size = 3, 25, 40
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded test process
    barrier = ctx.Barrier(workers)
    procs = [
        ctx.Process(target=_sqlite_writer, args=(uri, w, batches, size, barrier))
        for w in range(workers)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0] * workers
    with open_store(uri) as store:
        assert store.count() == workers * batches * size + 5
        for w in range(workers):
            assert store.get(f"news:w{w}-{batches - 1}-{size - 1}") is not None
        shared = store.get("news:shared-0")
        assert shared is not None and shared["batch"] == batches - 1
    conn = sqlite3.connect(tmp_path / "shared.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_sqlite_lock_held_too_long_is_store_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "BUSY_TIMEOUT", 0.05)
    monkeypatch.setattr(sqlite_module, "LOCK_ATTEMPTS", 2)
    path = tmp_path / "locked.db"
    store = open_store(f"sqlite:///{path}")
    store.upsert_many([doc("first")])
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    with pytest.raises(StoreUnavailable, match="locked"):
        store.upsert_many([doc("second")])
    holder.execute("ROLLBACK")
    holder.close()
    store.upsert_many([doc("second")])  # the same store recovers once the lock is free
    assert store.count() == 2
    store.close()


def test_sqlite_uri_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert sqlite_module.sqlite_path("sqlite:///rel/items.db") == "rel/items.db"
    assert sqlite_module.sqlite_path("sqlite:////abs/items.db") == "/abs/items.db"
    with open_store("sqlite:///sub/dir/items.db") as store:  # missing directories are created
        store.upsert_many([doc("a")])
    assert (tmp_path / "sub" / "dir" / "items.db").exists()


# -- MongoDB specifics and shared helpers -------------------------------------------------


def test_unreachable_mongodb_is_store_unavailable() -> None:
    store = open_store("mongodb://127.0.0.1:1/db?serverSelectionTimeoutMS=200")
    assert isinstance(store, MongoStore) and store.collection.database.name == "db"
    with pytest.raises(StoreUnavailable):
        store.upsert_many([doc("a")])
    store.close()


def test_mongo_database_defaults_to_meteorseed() -> None:
    store = open_store("mongodb://127.0.0.1:1")
    assert isinstance(store, MongoStore)
    assert store.collection.full_name == "meteorseed.items"  # database, the contract's collection
    store.close()


@pytest.mark.parametrize("uri", ["redis://x", "mysql://db/x", "items.db", "sqlite://"])
def test_unknown_store_uri_names_the_setting(uri: str) -> None:
    with pytest.raises(ValueError, match="METEORSEED_STORE_URI"):
        open_store(uri)


def test_build_document_shape_and_reserved_fields() -> None:
    built = build_document(
        {"title": "x", "unique_key": "k"},
        site_id="s",
        url="https://s.example/",
        seed_id="seed",
        task_id="t",
        unique_key="k",
        now=T0,
    )
    assert next(iter(built)) == "_id" and built["_id"] == "s:k"
    assert built["unique_key"] == "k"  # the item's own field is kept
    item_url = build_document(
        {"url": "https://s.example/final"},
        site_id="s",
        url="https://s.example/",
        seed_id=None,
        task_id=None,
        unique_key="k",
    )
    assert item_url["url"] == "https://s.example/final"
    with pytest.raises(DocumentError, match="updated_at"):
        build_document(
            {"updated_at": "yesterday"},
            site_id="s",
            url=None,
            seed_id=None,
            task_id=None,
            unique_key="k",
        )


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"raw": b"bytes"}, "raw"),
        ({"deep": {"list": [1, frozenset({2})]}}, r"deep\.list\[1\]"),
        ({"score": float("nan")}, "score"),
        ({"$set": 1}, r"\$set"),
        ({"m": {3: "int key"}}, "m.3"),
    ],
)
def test_check_fields_names_the_bad_field(fields: dict, field_name: str) -> None:
    with pytest.raises(DocumentError, match=field_name):
        check_fields(fields)


def test_check_fields_normalises_tuples() -> None:
    assert check_fields({"t": (1, (2, 3))}) == {"t": [1, [2, 3]]}


def test_last_wins_keeps_first_seen_of_the_first_occurrence() -> None:
    a1 = {"_id": "a", "v": 1, "first_seen_at": "1"}
    b = {"_id": "b", "v": 1, "first_seen_at": "1"}
    a2 = {"_id": "a", "v": 2, "first_seen_at": "2"}
    assert last_wins([a1, b, a2]) == [b, {"_id": "a", "v": 2, "first_seen_at": "1"}]


# -- anomalies: items that failed validation, kept apart from the items ---------------------


def test_anomalies_are_kept_apart_from_items(store: Store) -> None:
    bad = {**doc("a", title=""), "reasons": ["title: required but empty"]}
    store.upsert_anomalies([bad])
    assert store.count() == 0 and store.get("news:a") is None
    assert list(store.iter_anomalies()) == [bad]
    store.upsert_many([doc("a", title="fine")])
    assert [d["_id"] for d in store.iter_anomalies()] == ["news:a"]
    assert store.count() == 1


def test_anomaly_upsert_replaces_reasons_and_keeps_first_seen_at(open_: Opener) -> None:
    first = {**doc("a", at=T0), "reasons": ["price: not a number"]}
    later = {**doc("a", at=T0 + timedelta(hours=1)), "reasons": ["title: required but empty"]}
    open_().upsert_anomalies([first])
    open_().upsert_anomalies([later])  # another connection, as another worker would
    (got,) = list(open_().iter_anomalies())
    assert got["reasons"] == ["title: required but empty"]
    assert got["first_seen_at"] == utc_timestamp(T0)
    assert got["updated_at"] == utc_timestamp(T0 + timedelta(hours=1))


def test_sqlite_anomalies_table_shape(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/a.db")
    store.upsert_anomalies([{**doc("x"), "reasons": ["r"]}])
    store.close()
    with sqlite3.connect(tmp_path / "a.db") as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(anomalies)")]
        (raw,) = conn.execute("SELECT doc FROM anomalies WHERE _id = 'news:x'").fetchone()
    assert columns == ["_id", "doc", "namespace"]
    assert '"reasons":["r"]' in raw


# -- namespaces, indexes, retention ---------------------------------------------------------


def test_namespaces_sharing_a_database_keep_their_own_documents(open_: Opener) -> None:
    blue, green = open_("blue"), open_("green")
    blue.upsert_many([doc("a", colour="blue"), doc("b", colour="blue")])
    green.upsert_many([doc("a", colour="green", at=T0 + timedelta(hours=1))])
    green.upsert_anomalies([{**doc("x"), "reasons": ["r"]}])
    assert blue.get("news:a") == doc("a", colour="blue")  # not overwritten
    assert green.get("news:a") == doc("a", colour="green", at=T0 + timedelta(hours=1))
    assert (blue.count(), green.count()) == (2, 1)
    assert count_by_site(blue) == {"news": 2} and all_ids(green) == {"news:a"}
    assert list(blue.iter_anomalies()) == [] and len(list(green.iter_anomalies())) == 1
    assert open_().count() == 0  # the default namespace is one more of them


def test_retention_deletes_what_was_not_updated_for_that_long(open_: Opener) -> None:
    kept = open_("other")
    kept.upsert_many([doc("old-elsewhere", at=T0)])
    store = open_("ns", retention=3600)
    now = datetime.now(timezone.utc)
    recent = doc("recent", at=now - timedelta(minutes=5))
    store.upsert_many([doc("old", at=T0), recent])
    # SQL: purged right after the first write; MongoDB: its TTL monitor (every 60 s on a
    # server; mongomock-ng expires on every read).
    wait_for(lambda: all_ids(store) == {"news:recent"}, 120)
    assert store.get("news:recent") == recent  # (MongoDB's TTL field is not shown)
    assert all_ids(kept) == {"news:old-elsewhere"}  # another namespace's are its own
    assert store.purge_older_than(utc_timestamp(now)) == 1
    assert store.count() == 0


def test_mongodb_retention_is_a_ttl_index_and_goes_when_turned_off(open_: Opener) -> None:
    open_("ns").upsert_many([doc("before", at=T0)])  # written while retention was off
    store = open_("ns", retention=7200)
    if not isinstance(store, MongoStore):
        pytest.skip("MongoDB only: SQL stores purge from the store stage")
    store.upsert_many([doc("a", at=T0 + timedelta(days=10_000))])
    assert all_ids(store) == {"news:a"}  # "before" got its date, and expired
    index = store.collection.index_information()["retention"]
    assert index["expireAfterSeconds"] == 7200 and index["key"] == [("_updated_date", 1.0)]
    raw = store.collection.find_one({"_id": "news:a"})
    assert raw["_updated_date"].replace(tzinfo=timezone.utc) == T0 + timedelta(days=10_000)
    open_("ns", retention=60).upsert_many([doc("b")])  # another retention: the index follows
    assert store.collection.index_information()["retention"]["expireAfterSeconds"] == 60
    open_("ns").upsert_anomalies([doc("r")])  # a store not in charge (the anomaly writer)
    assert "retention" in store.collection.index_information()
    open_("ns", retention=0).upsert_many([doc("c")])  # retention off: nothing expires any more
    assert "retention" not in store.collection.index_information()


def test_retention_setting_is_validated() -> None:
    from scrapy.settings import Settings

    from meteorseed_scrapy.settings import DEFAULTS, StoreConfig

    assert DEFAULTS["METEORSEED_STORE_RETENTION"] == 0
    assert StoreConfig.from_settings(Settings({"METEORSEED_STORE_RETENTION": "30d"})
                                     ).retention == 30 * 86400
    with pytest.raises(ValueError, match="METEORSEED_STORE_RETENTION"):
        StoreConfig.from_settings(Settings({"METEORSEED_STORE_RETENTION": "soon"}))


def _index_names(store: Store) -> set[str]:
    inner = getattr(store, "inner", store)
    if isinstance(inner, MongoStore):
        return set(inner.collection.index_information())
    if isinstance(inner, sqlite_module.SQLiteStore):
        return {row[1] for row in inner._run(lambda c: c.execute(
            "SELECT type, name FROM sqlite_master WHERE tbl_name = 'items'").fetchall())}
    return {row[0] for row in inner._rows(  # type: ignore[attr-defined]
        "SELECT indexname FROM pg_indexes WHERE tablename = 'items' AND %s::text IS NOT NULL")}


def test_the_store_creates_indexes_for_the_questions_people_ask(store: Store) -> None:
    store.upsert_many([doc("a", content_fingerprint="f" * 40)])
    names = _index_names(store)
    for question in ("site_time", "seed_page", "fingerprint", "updated"):
        assert any(name.endswith(question) for name in names), (question, names)


def test_sqlite_rows_from_before_namespaces_are_adopted(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # the shape every earlier version created
        for table in ("items", "anomalies"):
            conn.execute(f"CREATE TABLE {table} (_id TEXT PRIMARY KEY, doc TEXT NOT NULL)")
        conn.execute("INSERT INTO items VALUES ('news:a', ?)", (json.dumps(doc("a")),))
        conn.execute("INSERT INTO anomalies VALUES ('news:z', ?)", (json.dumps(doc("z")),))
    conn.close()
    with open_store(f"sqlite:///{path}", "prod") as store:
        assert store.get("news:a") == doc("a")
        assert [d["_id"] for d in store.iter_anomalies()] == ["news:z"]
        store.upsert_many([doc("a", title="again"), doc("b")])
        assert store.count() == 2
    with open_store(f"sqlite:///{path}", "other") as other:
        assert other.count() == 0


# -- the change order of `meteorseed export` (Store.export_page) ------------------------------

def _export_all(store: Store, after: Any = None, page: int = 3, **where: Any) -> list[Any]:
    """Every (position, document) after ``after``, read ``page`` at a time."""
    out: list[Any] = []
    while True:
        got = store.export_page(after, page, **where)
        out += got
        if len(got) < page:
            return out
        after = got[-1][0]


def test_export_pages_resume_and_give_each_document_once(store: Store) -> None:
    store.upsert_many([doc(f"k{i:02d}") for i in range(7)])
    store.upsert_many([doc("s1", site="shop"), doc("s2", site="shop")])
    every = _export_all(store)
    assert sorted(d["_id"] for _, d in every) == sorted(all_ids(store))
    assert len(every) == 9
    positions = [p for p, _ in every]
    assert positions == sorted(positions) and len(set(positions)) == 9
    assert every[0][1] == store.get(every[0][1]["_id"])  # whole documents, nothing hidden
    # Interrupted after four, resumed from the fourth's position: the rest, once.
    rest = _export_all(store, positions[3])
    assert [d["_id"] for _, d in rest] == [d["_id"] for _, d in every[4:]]
    assert _export_all(store, positions[-1]) == []


def test_export_gives_changed_documents_again_and_unchanged_never(store: Store) -> None:
    store.upsert_many([doc("a"), doc("b"), doc("c")])
    first = _export_all(store)
    cursor = first[-1][0]
    store.upsert_many([doc("b", title="changed")])
    store.upsert_many([doc("d")])
    again = _export_all(store, cursor)
    assert [d["_id"] for _, d in again] == ["news:b", "news:d"]
    assert again[0][1]["title"] == "changed"
    assert again[0][1]["first_seen_at"] == first[1][1]["first_seen_at"]


def test_export_filters_by_site_and_seed(open_: Opener) -> None:
    store = open_()
    store.upsert_many([doc("a"), doc("b", site="shop"), {**doc("c"), "seed_id": "seed2"}])
    assert [d["_id"] for _, d in _export_all(store, site_id="shop")] == ["shop:b"]
    assert [d["_id"] for _, d in _export_all(store, seed_id="seed2")] == ["news:c"]
    assert [d["_id"] for _, d in _export_all(store, site_id="news", seed_id="seed1")] == [
        "news:a"]
    assert _export_all(open_("elsewhere")) == []  # a namespace's own documents only


def test_postgres_export_waits_for_a_write_in_flight(postgres_uri: str) -> None:
    """A transaction that began first and commits last is not skipped: nothing written after
    it began is exported until it ends, then both come, in transaction order."""
    import psycopg

    from meteorseed_scrapy.store.postgres import _UPSERT
    from meteorseed_scrapy.store.postgres_export import CHANGE_ON_UPDATE

    store = open_store(postgres_uri)
    try:
        store.upsert_many([doc("before")])
        cursor = store.export_page(None, 10)[-1][0]
        with psycopg.connect(postgres_uri) as late:  # (not autocommit: a transaction)
            late.execute((_UPSERT.format(t="items") + CHANGE_ON_UPDATE).encode(),
                         (DEFAULT_NAMESPACE, json.dumps([doc("late")])))
            store.upsert_many([doc("early")])  # began after, committed first
            assert store.export_page(cursor, 10) == []
            late.commit()
        assert [d["_id"] for _, d in store.export_page(cursor, 10)] == ["news:late",
                                                                         "news:early"]
    finally:
        store.close()


def test_sqlite_export_of_a_table_from_before_the_change_order(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # the namespaced shape, without seq
        conn.execute("CREATE TABLE items (_id TEXT NOT NULL, doc TEXT NOT NULL,"
                     " namespace TEXT NOT NULL, PRIMARY KEY (namespace, _id))")
        conn.execute("INSERT INTO items VALUES ('news:a', ?, ?)",
                     (json.dumps(doc("a")), DEFAULT_NAMESPACE))
    conn.close()
    with open_store(f"sqlite:///{path}") as store:
        first = store.export_page(None, 10)
        assert [(p, d["_id"]) for p, d in first] == [((0, "news:a"), "news:a")]
        store.upsert_many([doc("b")])
        assert [d["_id"] for _, d in store.export_page(first[-1][0], 10)] == ["news:b"]


def test_postgres_export_orders_transaction_ids_as_numbers(postgres_uri: str) -> None:
    import psycopg

    store = open_store(postgres_uri)
    try:
        store.upsert_many([doc("ten")])
        store.upsert_many([doc("nine")])
        with psycopg.connect(postgres_uri, autocommit=True) as conn:  # 10 before 9 as text
            conn.execute("UPDATE items SET xid = (CASE _id WHEN 'news:ten' THEN '10'"
                         " ELSE '9' END)::xid8")
        assert [(p, d["_id"]) for p, d in store.export_page(None, 10)] == [
            ((9, "news:nine"), "news:nine"), ((10, "news:ten"), "news:ten")]
        assert [d["_id"] for _, d in store.export_page((9, "news:nine"), 10)] == ["news:ten"]
    finally:
        store.close()
def test_a_seeds_items_page_by_a_stable_id_cursor(open_: Opener) -> None:
    # The documents of one seed only (another seed's, another namespace's left out), in
    # bytewise _id order, each page after the last _id of the one before: a document written
    # meanwhile before the cursor never shifts the pages after it.
    store, other_ns = open_(), open_("other")
    keys = ["b", "a", "é", "Z", "a0", "~", "10", "9"]
    for key in keys:
        store.upsert_many([build_document({"n": key}, site_id="news", url=f"https://n/{key}",
                                          seed_id="s1", task_id="t", unique_key=key, now=T0)])
    store.upsert_many([doc("x1")])  # seed1's
    other_ns.upsert_many([build_document({}, site_id="news", url="https://n/o", seed_id="s1",
                                         task_id="t", unique_key="o", now=T0)])
    pages, after = [], None
    while True:
        page = store.seed_items_page("s1", after, 3)
        if not page:
            break
        pages.append([d["_id"] for d in page])
        after = page[-1]["_id"]
        if len(pages) == 1:  # written behind the cursor: the next pages are unchanged
            store.upsert_many([build_document({}, site_id="news", url="https://n/0",
                                              seed_id="s1", task_id="t", unique_key="0",
                                              now=T0)])
    expected = sorted((f"news:{k}" for k in keys), key=lambda i: i.encode("utf-8"))
    assert [i for page in pages for i in page] == expected
    assert [len(page) for page in pages] == [3, 3, 2]
    assert store.seed_items_page("nobody", None, 10) == []

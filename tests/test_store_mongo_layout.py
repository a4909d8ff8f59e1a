"""The MongoDB store's collections (store/mongo_layout.py): the default namespace's are
``items``, ``anomalies``, ``sequences`` and ``pages``, as the contract says; another
namespace's ``<ns>.items`` and so on; the previous version's ``meteorseed.<kind>`` is moved
to ``<kind>`` once, never merged, never taken by another namespace.

mongomock-ng by default; a real server too when ``METEORSEED_TEST_MONGO_URL`` is set.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import mongomock_ng
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy.store import mongo_layout
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.base import DEFAULT_NAMESPACE, Store
from meteorseed_scrapy.store.mongo import MongoStore
from meteorseed_scrapy.store.mongo_layout import collection_name
from meteorseed_scrapy.store.page_cache import CacheRow, open_page_cache
from tests.test_stores_contract import _real_mongo_uri, doc

KINDS = ("items", "anomalies", "sequences", "pages")


@pytest.fixture(params=["mongomock", "mongodb"])
def mongo_uri(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "mongomock":
        yield f"mongomock://{uuid.uuid4().hex}/testdb"
    else:
        yield from _real_mongo_uri()


@pytest.fixture
def open_(mongo_uri: str) -> Iterator[Callable[..., MongoStore]]:
    opened: list[Store] = []

    def opener(namespace: str = DEFAULT_NAMESPACE) -> MongoStore:
        store = open_store(mongo_uri, namespace)
        opened.append(store)
        assert isinstance(store, MongoStore)
        return store

    yield opener
    for store in opened:
        store.close()


def names(store: MongoStore) -> set[str]:
    return set(store.database.list_collection_names())


def raw_ids(store: MongoStore, collection: str) -> set[str]:
    return {d["_id"] for d in store.database[collection].find({}, {"_id": 1})}


def write_all(store: MongoStore, uri: str, key: str) -> None:
    """A document, an anomaly (and so a change sequence) and a cached page in the store's
    namespace."""
    store.upsert_many([doc(key)])
    store.upsert_anomalies([{**doc(f"{key}-bad"), "reasons": ["r"]}])
    cache = open_page_cache(uri, store.namespace)
    cache.put([CacheRow(f"news:{key}", "news", "2026-12-01T00:00:00.000000Z", b"page")])
    cache.close()


# -- which collection is whose ------------------------------------------------------------


def test_the_default_namespace_writes_the_contract_s_collections(
        open_: Callable[..., MongoStore], mongo_uri: str) -> None:
    store = open_()
    write_all(store, mongo_uri, "a")
    assert set(KINDS) <= names(store)
    assert not any(name.startswith(f"{DEFAULT_NAMESPACE}.") for name in names(store))
    assert raw_ids(store, "items") == {"news:a"}
    assert raw_ids(store, "anomalies") == {"news:a-bad"}
    assert raw_ids(store, "pages") == {"news:a"}
    assert store.get("news:a") == doc("a")


def test_another_namespace_writes_its_own_and_leaves_items_alone(
        open_: Callable[..., MongoStore], mongo_uri: str) -> None:
    open_().upsert_many([doc("d")])
    store = open_("blue")
    write_all(store, mongo_uri, "a")
    assert names(store) == {"items", "sequences"} | {f"blue.{kind}" for kind in KINDS}
    assert raw_ids(store, "items") == {"news:d"} and store.count() == 1
    assert raw_ids(store, "blue.items") == {"news:a"}
    assert raw_ids(store, "blue.anomalies") == {"news:a-bad"}


def test_items_from_before_namespaces_are_the_default_namespace_s(
        open_: Callable[..., MongoStore]) -> None:
    raw = open_()
    raw.database["items"].insert_one(doc("a"))
    raw.database["anomalies"].insert_one(doc("z"))
    other = open_("prod")
    assert other.count() == 0 and list(other.iter_anomalies()) == []
    other.upsert_many([doc("b")])
    assert raw_ids(raw, "items") == {"news:a"}  # never taken by another namespace
    default = open_()
    assert default.get("news:a") == doc("a")
    assert [d["_id"] for d in default.iter_anomalies()] == ["news:z"]


def test_the_default_and_another_namespace_never_overwrite_each_other(
        open_: Callable[..., MongoStore]) -> None:
    default, other = open_(), open_("meteorseed2")
    default.upsert_many([doc("a", colour="default")])
    default.upsert_anomalies([{**doc("x"), "reasons": ["default"]}])
    other.upsert_many([doc("a", colour="other"), doc("b", colour="other")])
    other.upsert_anomalies([{**doc("x"), "reasons": ["other"]}])
    assert default.get("news:a") == doc("a", colour="default")
    assert other.get("news:a") == doc("a", colour="other")
    assert (default.count(), other.count()) == (1, 2)
    assert [d["reasons"] for d in default.iter_anomalies()] == [["default"]]
    assert [d["reasons"] for d in other.iter_anomalies()] == [["other"]]
    assert [d["_id"] for _, d in default.export_page(None, 10)] == ["news:a"]
    assert raw_ids(default, "items") == {"news:a"}


#: namespaces MongoDB can name collections after (the others are refused, tested below)
NAMEABLE = st.text(min_size=1).filter(
    lambda s: "$" not in s and "\0" not in s and s != "system" and not s.startswith("system."))


@given(NAMEABLE, NAMEABLE, st.sampled_from(KINDS), st.sampled_from(KINDS))
def test_no_two_namespaces_or_kinds_share_a_collection(ns1: str, ns2: str, kind1: str,
                                                       kind2: str) -> None:
    for a, b in ((ns1, ns2), (DEFAULT_NAMESPACE, ns2), (ns1, DEFAULT_NAMESPACE)):
        if (a, kind1) != (b, kind2):
            assert collection_name(a, kind1) != collection_name(b, kind2)


# -- the previous version's names ---------------------------------------------------------


def previous_version_wrote(store: MongoStore, key: str) -> None:
    """What the previous version left: the default namespace's collections named
    ``meteorseed.<kind>``, the export's counter at 41."""
    db = store.database
    db["meteorseed.items"].insert_one({**doc(key), "_change_seq": 41})
    db["meteorseed.anomalies"].insert_one({**doc(f"{key}-bad"), "reasons": ["r"]})
    db["meteorseed.sequences"].insert_one({"_id": "items", "n": 41, "inflight": []})
    db["meteorseed.pages"].insert_one({"_id": f"news:{key}", "site_id": "news", "size": 4,
                                       "fetched_at": "2026-12-01T00:00:00.000000Z",
                                       "data": b"page"})


def test_the_previous_names_are_moved_once_with_a_warning(
        open_: Callable[..., MongoStore], mongo_uri: str,
        caplog: pytest.LogCaptureFixture) -> None:
    previous_version_wrote(open_(), "a")
    with caplog.at_level(logging.WARNING, logger=mongo_layout.__name__):
        store = open_()
        assert store.get("news:a") == doc("a")
        cache = open_page_cache(mongo_uri, DEFAULT_NAMESPACE)
        assert cache.usage() == (1, 4)
        cache.close()
        for _ in range(2):  # opening again moves nothing, says nothing
            open_().count()
    moved = sorted(r.getMessage() for r in caplog.records)
    assert len(moved) == 4 and all(r.levelno == logging.WARNING for r in caplog.records)
    for kind, message in zip(sorted(KINDS), moved, strict=True):
        assert f"meteorseed.{kind} " in message and message.endswith(f"is now {kind}")
    assert names(store) == set(KINDS)
    assert [d["_id"] for d in store.iter_anomalies()] == ["news:a-bad"]
    store.upsert_many([doc("b")])  # the change order goes on from the moved counter
    assert [position for position, _ in store.export_page(None, 10)] == [
        (41, "news:a"), (42, "news:b")]


def test_an_empty_items_does_not_stop_the_move(open_: Callable[..., MongoStore]) -> None:
    store = open_()
    previous_version_wrote(store, "a")
    store.database.create_collection("items")  # made by hand, or by some tool
    assert open_().get("news:a") == doc("a")
    assert "meteorseed.items" not in names(store)


def test_both_names_holding_documents_are_never_merged(
        open_: Callable[..., MongoStore], caplog: pytest.LogCaptureFixture) -> None:
    store = open_()
    store.upsert_many([doc("new")])
    previous_version_wrote(store, "old")  # a worker of the previous version writing on
    with caplog.at_level(logging.WARNING, logger=mongo_layout.__name__):
        again = open_()
        assert again.count() == 1 and again.get("news:new") == doc("new")
    errors = [r for r in caplog.records if "meteorseed.items " in r.getMessage()]
    assert [r.levelno for r in errors] == [logging.ERROR]
    message = errors[0].getMessage()
    assert "and items both hold documents" in message and "$merge" in message
    assert "then drop meteorseed.items" in message
    assert raw_ids(store, "meteorseed.items") == {"news:old"}  # left as it was
    # (the anomalies had no documents under the new name: they were moved)
    assert [d["_id"] for d in again.iter_anomalies()] == ["news:old-bad"]


@pytest.mark.parametrize(("empty_items", "other_moves_after", "refused"), [
    (False, 1, True),  # after the source was read: the rename is refused (source gone)
    (True, 1, False),  # after the (empty) target was read: the source is found empty
    (True, 2, True),  # after both: the rename replacing the empty target is refused
], ids=["rename refused", "source found empty", "rename replacing refused"])
def test_a_move_another_worker_made_first_is_not_an_error(
        open_: Callable[..., MongoStore], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, empty_items: bool, other_moves_after: int,
        refused: bool) -> None:
    previous_version_wrote(open_(), "a")
    if empty_items:
        open_().database.create_collection("items")
    first, late = open_(), open_()
    real = mongo_layout._holds_documents
    reads = 0

    def holds_documents(collection: Any) -> bool:  # the other worker moves in between
        nonlocal reads
        found = real(collection)
        reads += 1
        if reads == other_moves_after:
            with monkeypatch.context() as inner:
                inner.setattr(mongo_layout, "_holds_documents", real)
                first.count()
        return found

    monkeypatch.setattr(mongo_layout, "_holds_documents", holds_documents)
    with caplog.at_level(logging.DEBUG, logger=mongo_layout.__name__):
        assert late.get("news:a") == doc("a")
    late_says = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert ("MongoDB: meteorseed.items was renamed items by another worker" in late_says
            ) is refused
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "meteorseed.items" not in names(late) and raw_ids(late, "items") == {"news:a"}


def test_workers_opening_at_once_move_it_once(open_: Callable[..., MongoStore],
                                              mongo_uri: str, monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    if mongo_uri.startswith("mongomock"):
        _one_operation_at_a_time(monkeypatch)
    previous_version_wrote(open_(), "a")
    workers = [open_() for _ in range(4)]
    barrier = threading.Barrier(len(workers))
    counts: list[int] = []
    failures: list[BaseException] = []

    def start(store: MongoStore) -> None:
        barrier.wait()
        try:
            counts.append(store.count())
        except BaseException as exc:  # (reported below)
            failures.append(exc)

    with caplog.at_level(logging.WARNING, logger=mongo_layout.__name__):
        threads = [threading.Thread(target=start, args=(w,)) for w in workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == [] and counts == [1] * len(workers)
    warned = [r.getMessage() for r in caplog.records if "meteorseed.items " in r.getMessage()]
    assert len(warned) == 1 and not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "meteorseed.items" not in names(workers[0])


def _one_operation_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """mongomock-ng is not thread-safe (two renames at once lose a collection): each database
    operation runs alone, as a server applies it atomically; threads interleave between them."""
    lock = threading.RLock()
    for owner, name in ((mongomock_ng.Database, "rename_collection"),
                        (mongomock_ng.Database, "list_collection_names"),
                        (mongomock_ng.Collection, "find_one"),
                        (mongomock_ng.Collection, "create_index")):
        real = getattr(owner, name)

        def alone(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            with lock:
                return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, alone)


@pytest.mark.parametrize("namespace", ["system", "system.x", "a$b", "a\0b"])
def test_a_namespace_mongodb_cannot_name_a_collection_after_is_refused_naming_the_setting(
        namespace: str) -> None:
    from meteorseed_scrapy.validators import ConfigError

    with pytest.raises(ConfigError, match="METEORSEED_NAMESPACE"):
        collection_name(namespace, "items")
    with pytest.raises(ConfigError, match="METEORSEED_NAMESPACE"):
        open_store(f"mongomock://{uuid.uuid4().hex}/testdb", namespace)
    assert collection_name("systems", "items") == "systems.items"

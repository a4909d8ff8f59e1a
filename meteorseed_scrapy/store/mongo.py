"""MongoDB store: database from the URI path (default ``meteorseed``); the default namespace's
documents in collection ``items`` (and ``anomalies``), another namespace's in ``<ns>.items``
(and ``<ns>.anomalies``): namespaces sharing a database keep their own documents, ``_id``
unchanged. :mod:`.mongo_layout` names them, and on first use moves the default namespace's
collections from the names the previous version gave them (``meteorseed.items``, ...).

On first use the store also creates its indexes (:data:`INDEXES`: a site's documents by time,
a seed's, those with a content fingerprint, and ``updated_at`` for the retention).

Each document is written with one pipeline-style update per ``_id``::

    UpdateOne({"_id": id},
              [{"$replaceWith": {"$mergeObjects": [
                  {"$literal": doc},
                  {"first_seen_at": {"$ifNull": ["$first_seen_at", doc["first_seen_at"]]}}]}}],
              upsert=True)

``$replaceWith`` drops fields the new item lacks; ``$ifNull`` keeps the stored ``first_seen_at``;
``$literal`` stops string values that start with ``$`` from being read as field paths. It is
one atomic, idempotent operation per document, so a replayed batch changes nothing but
``updated_at``. A batch is one unordered ``bulk_write`` (duplicates are folded first, because
unordered writes may run in any order).

``mongomock://<name>/<db>`` opens an in-process mongomock-ng server (tests only): every store
opened with the same ``<name>`` sees the same data.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pymongo import MongoClient, UpdateOne
from pymongo.errors import BulkWriteError, ConnectionFailure, InvalidOperation, OperationFailure

from meteorseed_scrapy.store import mongo_export as changes
from meteorseed_scrapy.store.base import Store, StoreUnavailable
from meteorseed_scrapy.store.documents import last_wins
from meteorseed_scrapy.store.mongo_export import SEQUENCE_FIELD
from meteorseed_scrapy.store.mongo_layout import (
    ANOMALIES,
    ITEMS,
    SEQUENCES,
    adopt_previous_names,
    collection_name,
)

DEFAULT_DATABASE = "meteorseed"
#: name -> (keys, options) of the indexes on a namespace's items.
INDEXES: dict[str, tuple[list[tuple[str, int]], dict[str, Any]]] = {
    "site_time": ([("site_id", 1), ("updated_at", 1)], {}),
    # A seed's documents in _id order (paging by a stable cursor: seed_items_page).
    "seed_page": ([("seed_id", 1), ("_id", 1)], {}),
    "fingerprint": ([("content_fingerprint", 1)],
                    {"partialFilterExpression": {"content_fingerprint": {"$exists": True}}}),
    "updated": ([("updated_at", 1)], {}),
    "changes": ([(SEQUENCE_FIELD, 1), ("_id", 1)], {}),  # the export's (mongo_export.py)
}
#: ``METEORSEED_STORE_RETENTION`` on MongoDB: a TTL index on ``updated_at`` as a BSON date (TTL
#: indexes ignore strings), kept in a field of its own that reads leave out.
TTL_FIELD = "_updated_date"
TTL_INDEX = "retention"
_HIDDEN = {TTL_FIELD: 0, SEQUENCE_FIELD: 0}
#: pymongo waits 30 s for a server by default; fail faster so the pipeline's own retry loop
#: (which logs and counts) decides how long to keep trying.
SERVER_SELECTION_TIMEOUT_MS = 5000
_DUPLICATE_KEY = 11000  # two workers upserting one new _id at once: the loser may retry
#: Server errors about the store, not the document: an outage (credentials refused, no
#: right to write, disk full, shutting down or stepping down, a time limit hit).
_OUTAGE_CODES = frozenset({
    13,  # Unauthorized
    18,  # AuthenticationFailed
    50,  # MaxTimeMSExpired
    91,  # ShutdownInProgress
    189,  # PrimarySteppedDown
    262,  # ExceededTimeLimit
    11600,  # InterruptedAtShutdown
    11602,  # InterruptedDueToReplStateChange
    14031,  # OutOfDiskSpace
})

_MOCK_CLIENTS: dict[str, Any] = {}
_MOCK_LOCK = threading.Lock()


def database_name(uri: str) -> str:
    name = unquote(urlsplit(uri).path.lstrip("/"))
    return name or DEFAULT_DATABASE


def upsert_operation(doc: dict[str, Any], ttl: bool = False,
                     sequence: int | None = None) -> UpdateOne:
    """The upsert of ``doc``; with ``ttl``, it carries ``updated_at`` as a BSON date too, for
    the retention's TTL index (:data:`TTL_FIELD`, left out of every read); with ``sequence``,
    its change sequence (:data:`SEQUENCE_FIELD`, hidden too)."""
    keep_first_seen = {"$ifNull": ["$first_seen_at", doc.get("first_seen_at")]}
    parts: list[Any] = [{"$literal": doc}, {"first_seen_at": keep_first_seen}]
    if sequence is not None:
        parts.append({SEQUENCE_FIELD: {"$literal": sequence}})
    if ttl:
        parts.append({TTL_FIELD: {"$literal": _as_date(doc.get("updated_at"))}})
    pipeline = [{"$replaceWith": {"$mergeObjects": parts}}]
    return UpdateOne({"_id": doc["_id"]}, pipeline, upsert=True)


def _as_date(stamp: Any) -> datetime:
    try:
        return datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    except ValueError:  # (not written by utc_timestamp: expires counted from now)
        return datetime.now(timezone.utc)


def _retryable_bulk_error(exc: BulkWriteError) -> bool:
    details = exc.details or {}
    write_errors = details.get("writeErrors") or []
    if write_errors:
        return all(error.get("code") == _DUPLICATE_KEY or error.get("code") in _OUTAGE_CODES
                   for error in write_errors)
    return bool(details.get("writeConcernErrors"))


def _mock_client(name: str) -> Any:
    import mongomock_ng  # a test dependency only (the "dev" extra)

    with _MOCK_LOCK:
        client = _MOCK_CLIENTS.get(name)
        if client is None:
            client = _MOCK_CLIENTS[name] = mongomock_ng.MongoClient()
        return client


class MongoStore(Store):
    def __init__(self, client: Any, database: str = DEFAULT_DATABASE, *, owns_client: bool = True):
        self._client = client
        self._owns_client = owns_client
        self.database = client[database]
        self._ready_for: str | None = None  # the namespace whose collections are set up
        #: Seconds of the TTL index (0: none); None: left as it is (readers, anomaly writer).
        self.retention: float | None = None

    def keep_for(self, seconds: float) -> bool:
        self.retention, self._ready_for = seconds, None  # (the TTL index is made at next use)
        return True

    @property
    def collection(self) -> Any:
        return self.database[collection_name(self.namespace, ITEMS)]

    @property
    def anomalies(self) -> Any:
        return self.database[collection_name(self.namespace, ANOMALIES)]

    def _ready(self) -> None:
        """Once per namespace: take the collections of their previous names, create indexes."""
        if self._ready_for == self.namespace:
            return
        try:
            adopt_previous_names(self.database, self.namespace, (ITEMS, ANOMALIES, SEQUENCES))
            for name, (keys, options) in INDEXES.items():
                self.collection.create_index(keys, name=name, **options)
            self._ttl_index()
        except OperationFailure as exc:
            raise StoreUnavailable(f"MongoDB: {exc}") from exc
        except (ConnectionFailure, InvalidOperation) as exc:
            raise StoreUnavailable(f"MongoDB: {exc}") from exc
        self._ready_for = self.namespace

    @classmethod
    def from_uri(cls, uri: str) -> MongoStore:
        parts = urlsplit(uri)
        database = database_name(uri)
        if parts.scheme == "mongomock":
            return cls(_mock_client(parts.netloc), database, owns_client=False)
        options = {key.lower() for key in parse_qs(parts.query)}
        kwargs: dict[str, Any] = {"connect": False}  # no network before the first write
        if "serverselectiontimeoutms" not in options:
            kwargs["serverSelectionTimeoutMS"] = SERVER_SELECTION_TIMEOUT_MS
        return cls(MongoClient(uri, **kwargs), database)

    def _ttl_index(self) -> None:
        """The retention's TTL index as configured, or none (retention off: nothing expires)."""
        if self.retention is None:
            return
        seconds = max(1, int(self.retention)) if self.retention > 0 else None
        existing = self.collection.index_information().get(TTL_INDEX)
        if existing is not None and existing.get("expireAfterSeconds") != seconds:
            # (collMod would change it in place; mongomock-ng lacks it, and a moment without
            # the index only delays an expiry)
            self.collection.drop_index(TTL_INDEX)
            existing = None
        if existing is None and seconds is not None:
            # Documents written while retention was off get their date now, or never expire.
            self.collection.update_many(
                {TTL_FIELD: {"$exists": False}, "updated_at": {"$type": "string"}},
                [{"$set": {TTL_FIELD: {"$dateFromString": {"dateString": "$updated_at",
                                                           "onError": "$$NOW"}}}}])
            self.collection.create_index([(TTL_FIELD, 1)], name=TTL_INDEX,
                                         expireAfterSeconds=seconds)

    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        self._upsert(self.collection, docs)

    def upsert_anomalies(self, docs: list[dict[str, Any]]) -> None:
        self._upsert(self.anomalies, docs)

    def _upsert(self, collection: Any, docs: list[dict[str, Any]]) -> None:
        ttl = bool(self.retention) and collection is self.collection
        folded = last_wins(docs)
        if not folded:
            return
        self._ready()
        try:
            # (items only: the export's change order, reserved and released around the write:
            # two more round trips per batch, mongo_export.py)
            sequence = (changes.reserve_sequence(self.database, self.namespace)
                        if collection is self.collection else None)
            operations = [upsert_operation(doc, ttl, sequence) for doc in folded]
            with changes.released_after(self.database, self.namespace, sequence):
                collection.bulk_write(operations, ordered=False)
        except (ConnectionFailure, InvalidOperation) as exc:
            # AutoReconnect, NotPrimary, ServerSelectionTimeout..., or a closed client
            raise StoreUnavailable(f"MongoDB: {exc}") from exc
        except BulkWriteError as exc:
            if _retryable_bulk_error(exc):
                raise StoreUnavailable(f"MongoDB: transient write errors: {exc}") from exc
            raise
        except OperationFailure as exc:
            if exc.has_error_label("RetryableWriteError") or exc.code in _OUTAGE_CODES:
                raise StoreUnavailable(f"MongoDB: {exc}") from exc
            raise

    def purge_older_than(self, cutoff: str) -> int:
        self._ready()
        try:
            return int(self.collection.delete_many({"updated_at": {"$lt": cutoff}}).deleted_count)
        except (ConnectionFailure, InvalidOperation, OperationFailure) as exc:
            raise StoreUnavailable(f"MongoDB: {exc}") from exc

    def get(self, doc_id: str) -> dict[str, Any] | None:
        self._ready()
        doc = self.collection.find_one({"_id": doc_id}, _HIDDEN)
        return None if doc is None else dict(doc)

    def count(self) -> int:
        self._ready()
        return int(self.collection.count_documents({}))

    def iter_docs(self) -> Iterator[dict[str, Any]]:
        self._ready()
        for doc in self.collection.find({}, _HIDDEN).sort("_id", 1):
            yield dict(doc)

    def iter_anomalies(self) -> Iterator[dict[str, Any]]:
        self._ready()
        for doc in self.anomalies.find({}).sort("_id", 1):
            yield dict(doc)

    def seed_items_page(self, seed_id: str, after: str | None, limit: int
                        ) -> list[dict[str, Any]]:
        self._ready()
        query: dict[str, Any] = {"seed_id": seed_id}
        if after is not None:
            query["_id"] = {"$gt": after}
        try:
            found = self.collection.find(query, _HIDDEN).sort("_id", 1).limit(limit)
            return [dict(doc) for doc in found]
        except (ConnectionFailure, InvalidOperation, OperationFailure) as exc:
            raise StoreUnavailable(f"MongoDB: {exc}") from exc

    # -- export (meteorseed export) -------------------------------------------------------

    export_kind = "mongodb"

    def export_page(self, after: tuple[int, str] | None, limit: int, *,
                    site_id: str | None = None, seed_id: str | None = None
                    ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
        self._ready()
        try:
            bound = changes.export_bound(self.database, self.namespace)
            return changes.export_docs(self.collection, after, limit, site_id, seed_id, bound)
        except (ConnectionFailure, InvalidOperation, OperationFailure) as exc:
            raise StoreUnavailable(f"MongoDB: {exc}") from exc

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

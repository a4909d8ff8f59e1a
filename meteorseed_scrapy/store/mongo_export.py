"""The MongoDB store's change order, read by ``meteorseed export`` (:meth:`Store.export_page`).

Each batch written to a namespace's items reserves the next value of a counter and stores it
in each of its documents as ``_change_seq``, left out of every read. Position:
``(_change_seq, _id)``; documents written before the change order have none and come first
(position 0).

A counter is not commit order: with several writers, batch 7 may still be writing while batch
8 is done, and an export that read past 8 would never come back for 7. So the reservation
also records the value as *in flight* (one atomic update of the counter document ``items``
in the namespace's ``sequences`` collection, :mod:`.mongo_layout`: ``n`` and ``inflight``),
the writer removes it once its ``bulk_write`` returned, and an export reads only below its
*bound*: the lowest value in flight, else the counter's value + 1 (a batch reserving later
gets a higher value). Every document below the bound is committed, so a cursor never passes a
batch still writing: at least once, never skipped, in any interleaving
(tests/test_export_mongo_concurrency.py).

Two round trips per batch (reserve, release) on one small document, which every writer of
the namespace updates. A writer that dies between the two leaves its value in flight: it
holds the export back until it is :data:`IN_FLIGHT_TIMEOUT_S` old (by this machine's clock),
then the export drops it with a warning (a batch still writing after that long may then be
passed over).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import BulkWriteError, OperationFailure

from meteorseed_scrapy.store.mongo_layout import SEQUENCES, collection_name

logger = logging.getLogger(__name__)

SEQUENCE_FIELD = "_change_seq"
_TTL_FIELD = "_updated_date"  # (mongo.TTL_FIELD: the retention's, never exported)
_COUNTER = {"_id": "items"}
#: Seconds after which a value still in flight is taken for a dead writer's.
IN_FLIGHT_TIMEOUT_S = 600.0


def _sequences(database: Any, namespace: str) -> Any:
    return database[collection_name(namespace, SEQUENCES)]


def reserve_sequence(database: Any, namespace: str) -> int:
    """The next change sequence, recorded as in flight until :func:`release_sequence`."""
    now = datetime.now(timezone.utc)
    counter = _sequences(database, namespace).find_one_and_update(
        _COUNTER,
        [{"$set": {"n": {"$add": [{"$ifNull": ["$n", 0]}, 1]}}},
         {"$set": {"inflight": {"$concatArrays": [
             {"$ifNull": ["$inflight", []]}, [{"s": "$n", "at": {"$literal": now}}]]}}}],
        upsert=True, return_document=ReturnDocument.AFTER)
    return int(counter["n"])


def release_sequence(database: Any, namespace: str, sequence: Any) -> None:
    """``sequence``'s batch is written (or failed): exports may read past it."""
    _sequences(database, namespace).update_one(_COUNTER, {"$pull": {"inflight": {"s": sequence}}})


@contextmanager
def released_after(database: Any, namespace: str, sequence: int | None) -> Iterator[None]:
    """Release ``sequence`` (None: none) once the write in the block is over: done, or refused
    by the server. Not after a lost connection, when the server may still be writing: the value
    stays in flight until it times out."""
    try:
        yield
    except (BulkWriteError, OperationFailure):
        if sequence is not None:
            release_sequence(database, namespace, sequence)
        raise
    if sequence is not None:
        release_sequence(database, namespace, sequence)


def export_bound(database: Any, namespace: str) -> int | None:
    """The change sequence below which every batch is committed (None: no batch has a
    sequence yet)."""
    counter = _sequences(database, namespace).find_one(_COUNTER)
    if counter is None:
        return None
    oldest = datetime.now(timezone.utc) - timedelta(seconds=IN_FLIGHT_TIMEOUT_S)
    live: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []
    for reserved in counter.get("inflight") or []:
        at = reserved.get("at")
        if isinstance(at, datetime) and at.tzinfo is None:
            at = at.replace(tzinfo=timezone.utc)  # (BSON dates come back naive, in UTC)
        (live if isinstance(at, datetime) and at >= oldest else dead).append(reserved)
    for reserved in dead:
        logger.warning("MongoDB export: change sequence %s of namespace %r was reserved at %s "
                       "and never released (a writer died?): exporting past it",
                       reserved.get("s"), namespace, reserved.get("at"))
        release_sequence(database, namespace, reserved.get("s"))
    values = [int(reserved["s"]) for reserved in live]
    return min(values) if values else int(counter.get("n") or 0) + 1


def export_docs(collection: Any, after: tuple[int, str] | None, limit: int,
                site_id: str | None, seed_id: str | None, bound: int | None = None
                ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
    """Up to ``limit`` documents after position ``after``, below change sequence ``bound``."""
    clauses: list[dict[str, Any]] = []
    if after is not None:
        sequence, doc_id = after
        later: list[dict[str, Any]] = [{SEQUENCE_FIELD: {"$gt": sequence}},
                                       {SEQUENCE_FIELD: sequence, "_id": {"$gt": doc_id}}]
        if sequence == 0:  # (documents from before the change order are at 0)
            later.append({SEQUENCE_FIELD: {"$exists": False}, "_id": {"$gt": doc_id}})
        clauses.append({"$or": later})
    if bound is not None:
        clauses.append({"$or": [{SEQUENCE_FIELD: {"$lt": bound}},
                                {SEQUENCE_FIELD: {"$exists": False}}]})
    if site_id is not None:
        clauses.append({"site_id": site_id})
    if seed_id is not None:
        clauses.append({"seed_id": seed_id})
    query = {"$and": clauses} if clauses else {}
    found = collection.find(query).sort(
        [(SEQUENCE_FIELD, 1), ("_id", 1)]).limit(limit)
    page = []
    for doc in found:
        sequence = int(doc.pop(SEQUENCE_FIELD, 0) or 0)
        doc.pop(_TTL_FIELD, None)
        page.append(((sequence, str(doc["_id"])), dict(doc)))
    return page


__all__ = ["IN_FLIGHT_TIMEOUT_S", "SEQUENCE_FIELD", "export_bound", "export_docs",
           "release_sequence", "released_after", "reserve_sequence"]

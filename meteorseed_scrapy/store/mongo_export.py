"""The MongoDB store's change order, read by ``meteorseed export`` (:meth:`Store.export_page`).

Each batch written to a namespace's items takes the next value of a counter
(``<ns>.sequences``, one ``$inc``: one more round trip per batch) and stores it in each of its
documents as ``_change_seq``, left out of every read. Position: ``(_change_seq, _id)``;
documents written before the change order have none and come first (position 0).

Unlike SQLite's (one write lock) and PostgreSQL's (transaction snapshots), this order is not
commit order when several workers write at once: a batch that took its sequence before
another but commits after an export read past it is not exported by that cursor. The export is
exact when the writers are stopped or idle; with live writers, resume from a cursor taken a
little earlier (``meteorseed export`` documents this; docs/items-feed.md).
"""

from __future__ import annotations

from typing import Any

from pymongo import ReturnDocument

SEQUENCE_FIELD = "_change_seq"
_TTL_FIELD = "_updated_date"  # (mongo.TTL_FIELD: the retention's, never exported)


def next_sequence(database: Any, namespace: str) -> int:
    counter = database[f"{namespace}.sequences"].find_one_and_update(
        {"_id": "items"}, {"$inc": {"n": 1}}, upsert=True, return_document=ReturnDocument.AFTER)
    return int(counter["n"])


def export_docs(collection: Any, after: tuple[int, str] | None, limit: int,
                site_id: str | None, seed_id: str | None
                ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
    query: dict[str, Any] = {}
    if after is not None:
        sequence, doc_id = after
        later: list[dict[str, Any]] = [{SEQUENCE_FIELD: {"$gt": sequence}},
                                       {SEQUENCE_FIELD: sequence, "_id": {"$gt": doc_id}}]
        if sequence == 0:  # (documents from before the change order are at 0)
            later.append({SEQUENCE_FIELD: {"$exists": False}, "_id": {"$gt": doc_id}})
        query["$or"] = later
    if site_id is not None:
        query["site_id"] = site_id
    if seed_id is not None:
        query["seed_id"] = seed_id
    found = collection.find(query).sort(
        [(SEQUENCE_FIELD, 1), ("_id", 1)]).limit(limit)
    page = []
    for doc in found:
        sequence = int(doc.pop(SEQUENCE_FIELD, 0) or 0)
        doc.pop(_TTL_FIELD, None)
        page.append(((sequence, str(doc["_id"])), dict(doc)))
    return page


__all__ = ["SEQUENCE_FIELD", "export_docs", "next_sequence"]

"""The page cache in MongoDB: the namespace's collection ``pages`` (``<ns>.pages`` for a namespace
other than the default, :mod:`.mongo_layout`) next to its items.

One document per entry: ``{_id: <key>, site_id, fetched_at, size, data: <BinData>}``, indexed
by (site_id, fetched_at, _id) for a site's pages by time and by fetched_at for the eviction.
The connection is a :class:`~.mongo.MongoStore`'s (the same URI handling, timeouts and
``mongomock://`` for tests), opened for the cache alone.
"""

from __future__ import annotations

from typing import Any

from bson import Binary
from pymongo import ReplaceOne

from meteorseed_scrapy.store.mongo import MongoStore
from meteorseed_scrapy.store.mongo_layout import PAGES, adopt_previous_names, collection_name
from meteorseed_scrapy.store.page_cache import CacheRow, PageCache

_CHUNK = 500


class MongoPageCache(PageCache):
    def __init__(self, store: MongoStore) -> None:
        self._store = store
        self.shown = f"MongoDB {store.database.name}"
        self._ready_for: str | None = None

    @property
    def collection(self) -> Any:
        database = self._store.database
        pages = database[collection_name(self.namespace, PAGES)]
        if self._ready_for != self.namespace:
            adopt_previous_names(database, self.namespace, (PAGES,))
            pages.create_index([("site_id", 1), ("fetched_at", 1), ("_id", 1)],
                               name="pages_site_time")
            pages.create_index([("fetched_at", 1)], name="pages_time")
            self._ready_for = self.namespace
        return pages

    def put(self, entries: list[CacheRow]) -> None:
        last = {entry.key: entry for entry in entries}
        if last:
            self.collection.bulk_write([
                ReplaceOne({"_id": e.key}, {"_id": e.key, "site_id": e.site_id,
                                            "fetched_at": e.fetched_at, "size": len(e.data),
                                            "data": Binary(e.data)}, upsert=True)
                for e in last.values()], ordered=False)

    def scan(self, site_id: str, since: str, after: tuple[str, str] | None,
             limit: int) -> list[CacheRow]:
        query: dict[str, Any] = {"site_id": site_id, "fetched_at": {"$gte": since}}
        if after is not None:
            query["$or"] = [{"fetched_at": {"$gt": after[0]}},
                            {"fetched_at": after[0], "_id": {"$gt": after[1]}}]
        found = self.collection.find(query).sort([("fetched_at", 1), ("_id", 1)]).limit(limit)
        return [CacheRow(str(d["_id"]), str(d["site_id"]), str(d["fetched_at"]), bytes(d["data"]))
                for d in found]

    def usage(self) -> tuple[int, int]:
        rows = list(self.collection.aggregate([{"$group": {"_id": None, "n": {"$sum": 1},
                                                           "bytes": {"$sum": "$size"}}}]))
        return (int(rows[0]["n"]), int(rows[0]["bytes"])) if rows else (0, 0)

    def evict(self, older_than: str, max_bytes: int) -> int:
        pages = self.collection
        gone = int(pages.delete_many({"fetched_at": {"$lt": older_than}}).deleted_count)
        total = self.usage()[1]
        victims: list[str] = []
        if total > max_bytes:
            for doc in pages.find({}, {"size": 1}).sort([("fetched_at", 1), ("_id", 1)]):
                if total <= max_bytes:
                    break
                victims.append(doc["_id"])
                total -= int(doc["size"])
        for start in range(0, len(victims), _CHUNK):
            pages.delete_many({"_id": {"$in": victims[start:start + _CHUNK]}})
        return gone + len(victims)

    def close(self) -> None:
        self._store.close()


def open_mongo_cache(uri: str) -> MongoPageCache:
    return MongoPageCache(MongoStore.from_uri(uri))


__all__ = ["MongoPageCache", "open_mongo_cache"]

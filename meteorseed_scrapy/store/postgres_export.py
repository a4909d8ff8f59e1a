"""The PostgreSQL store's change order, read by ``meteorseed export``
(:meth:`Store.export_page`).

``items.xid`` (``xid8``, PostgreSQL 13+) is the transaction that last wrote the row
(``pg_current_xact_id()``, set on insert and on every update). Transaction ids are handed out
when transactions start, not when they commit: a batch that commits late may carry a lower id
than one already read. So a page holds only rows whose transaction ended before every one still
running began (``xid < pg_snapshot_xmin(pg_current_snapshot())``): a write still in flight has
an id at or above that bound, hence above every position handed out so far, and comes in a
later page. The price: a long transaction anywhere on the server holds the export back (never
loses anything). Position: ``(xid, _id)``, ``_id`` in byte order.
"""

from __future__ import annotations

from typing import Any

from meteorseed_scrapy.store.export_cursor import field_conditions

#: For a table made before the change order: every row gets the id of this transaction.
ADD_CHANGE_COLUMN = ("ALTER TABLE items ADD COLUMN IF NOT EXISTS xid xid8 NOT NULL"
                     " DEFAULT pg_current_xact_id()")
#: Appended to the upsert into ``items``: an update moves the row to this transaction.
CHANGE_ON_UPDATE = ", xid = pg_current_xact_id()"


def export_query(namespace: str, after: tuple[int, str] | None, limit: int,
                 site_id: str | None, seed_id: str | None) -> tuple[str, list[Any]]:
    # (The output column is not named xid: ORDER BY xid would sort by its text, 10 before 9.)
    sql = ("SELECT xid::text AS position, _id, doc FROM items WHERE namespace = %s"
           " AND xid < pg_snapshot_xmin(pg_current_snapshot())")
    params: list[Any] = [namespace]
    if after is not None:
        sql += (' AND (xid > %s::text::xid8 OR (xid = %s::text::xid8'
                ' AND _id COLLATE "C" > %s))')
        params += [str(after[0]), str(after[0]), after[1]]
    conditions, values = field_conditions("doc->>'{}' = %s", site_id, seed_id)
    sql += conditions
    params += values
    sql += ' ORDER BY items.xid, _id COLLATE "C" LIMIT %s'
    params.append(limit)
    return sql, params


__all__ = ["ADD_CHANGE_COLUMN", "CHANGE_ON_UPDATE", "export_query"]

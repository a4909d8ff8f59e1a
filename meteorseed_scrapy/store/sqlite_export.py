"""The SQLite store's change order, read by ``meteorseed export`` (:meth:`Store.export_page`).

``items.seq`` is set by every upsert to one more than the namespace's highest (read in the
writing statement, under SQLite's one write lock): commit order is sequence order, so a reader
that has seen sequence ``n`` never later meets a commit at ``n`` or below. Rows of one batch may
share a sequence: ``(seq, _id)`` is the position. Index ``items_changes`` (namespace, seq, _id)
serves both the next sequence and the export's pages.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from meteorseed_scrapy.store.export_cursor import field_conditions
from meteorseed_scrapy.store.sqlite_schema import FIELD


def next_sequence(namespace: str) -> str:
    """SQL of the namespace's next change sequence. The namespace is a literal (quotes
    doubled): the statement's parameters are all its rows'."""
    literal = "'" + namespace.replace("'", "''") + "'"
    return f"SELECT COALESCE(MAX(seq), 0) + 1 FROM items WHERE namespace = {literal}"


def export_rows(conn: sqlite3.Connection, namespace: str, after: tuple[int, str] | None,
                limit: int, site_id: str | None, seed_id: str | None
                ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
    sql = "SELECT seq, _id, doc FROM items WHERE namespace = ?"
    params: list[Any] = [namespace]
    if after is not None:
        sql += " AND (seq, _id) > (?, ?)"
        params += [after[0], after[1]]
    conditions, values = field_conditions(FIELD + " = ?", site_id, seed_id)
    sql += conditions
    params += values
    sql += " ORDER BY seq, _id LIMIT ?"
    params.append(limit)
    return [((int(seq), str(doc_id)), json.loads(doc))
            for seq, doc_id, doc in conn.execute(sql, params).fetchall()]


__all__ = ["export_rows", "next_sequence"]

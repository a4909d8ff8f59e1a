"""The SQLite store's schema, its upsert and its change sequence (read by ``meteorseed export``).

Tables (created on first use)::

    CREATE TABLE items (
        _id TEXT NOT NULL,        -- "<site_id>:<unique_key>"
        doc TEXT NOT NULL,        -- the whole document as JSON, "_id" included
        namespace TEXT NOT NULL,  -- METEORSEED_NAMESPACE: namespaces sharing a file
        seq INTEGER NOT NULL DEFAULT 0,  -- the change sequence (below)
        PRIMARY KEY (namespace, _id)
    );

``anomalies`` has the same shape without ``seq``; other tables of the same file belong to other
modules. Indexes (:data:`INDEXES`) answer "a site's documents by time", "a seed's documents",
"documents with this content fingerprint" and the retention's "older than". A table of the
shape before namespaces is rebuilt on first use, its rows given to the namespace of the store
that opens it (logged).

The change order: ``items.seq`` is set by every upsert to one more than the namespace's highest
(read in the writing statement, under SQLite's one write lock): commit order is sequence order,
so a reader that has seen sequence ``n`` never later meets a commit at ``n`` or below. Rows of
one batch may share a sequence: ``(seq, _id)`` is the position. Index ``items_changes``
(namespace, seq, _id) serves both the next sequence and the export's pages.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import Any

from meteorseed_scrapy.store.export_cursor import field_conditions

logger = logging.getLogger(__name__)

ANOMALIES = "anomalies"  # items that failed their site's validation (meteorseed_scrapy.sites)
_TABLE = ("CREATE TABLE IF NOT EXISTS {t} (_id TEXT NOT NULL, doc TEXT NOT NULL,"
          " namespace TEXT NOT NULL, PRIMARY KEY (namespace, _id))")
FIELD = "json_extract(doc, '$.{}')"
#: name -> indexed expressions of ``items`` (each led by the namespace; the fingerprint's only
#: where there is one: most documents have none).
INDEXES = {
    "items_site_time": (f"{FIELD.format('site_id')}, {FIELD.format('updated_at')}", ""),
    # A seed's documents in _id order (paging by a stable cursor: Store.seed_items_page).
    "items_seed_page": (f"{FIELD.format('seed_id')}, _id", ""),
    "items_fingerprint": (FIELD.format("content_fingerprint"),
                          f" WHERE {FIELD.format('content_fingerprint')} IS NOT NULL"),
    "items_updated": (FIELD.format("updated_at"), ""),
    "items_changes": ("seq, _id", ""),  # the change order
}


def create_schema(conn: sqlite3.Connection, namespace: str) -> None:
    """The tables and indexes, in one transaction; tables of the shape before namespaces
    (no ``namespace`` column) are rebuilt with their rows given to ``namespace``."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table in ("items", ANOMALIES):
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            if columns and "namespace" not in columns:
                migrate_table(conn, table, namespace)
            conn.execute(_TABLE.format(t=table))
        add_change_sequence(conn)
        conn.execute("DROP INDEX IF EXISTS items_seed")  # (items_seed_page leads with it)
        for name, (expressions, where) in INDEXES.items():
            conn.execute(f"CREATE INDEX IF NOT EXISTS {name} ON items"
                         f" (namespace, {expressions}){where}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def add_change_sequence(conn: sqlite3.Connection) -> None:
    """``items.seq``, the change sequence of ``meteorseed export``, on a table made before it
    (its rows get 0: exported first, in ``_id`` order)."""
    columns = [row[1] for row in conn.execute("PRAGMA table_info(items)")]
    if "seq" not in columns:
        conn.execute("ALTER TABLE items ADD COLUMN seq INTEGER NOT NULL DEFAULT 0")


def migrate_table(conn: sqlite3.Connection, table: str, namespace: str) -> None:
    """Rebuild ``table`` of the shape before namespaces (``_id`` alone the key) with a
    ``namespace`` column, its rows given to ``namespace`` (in the caller's transaction)."""
    logger.warning("SQLite: table %s has no namespace column (written before namespaces): its "
                   "rows now belong to namespace %r", table, namespace)
    conn.execute(f"ALTER TABLE {table} RENAME TO {table}_before_namespaces")
    conn.execute(_TABLE.format(t=table))
    conn.execute(f"INSERT INTO {table} (_id, doc, namespace)"
                 f" SELECT _id, doc, ? FROM {table}_before_namespaces", (namespace,))
    conn.execute(f"DROP TABLE {table}_before_namespaces")


# -- writes and the change sequence ----------------------------------------------------------------
# COALESCE: a row written without first_seen_at (by hand, by an old version) adopts the new one.
_UPSERT_TAIL = (
    " ON CONFLICT(namespace, _id) DO UPDATE SET doc = json_set(excluded.doc, '$.first_seen_at',"
    " COALESCE(json_extract({table}.doc, '$.first_seen_at'),"
    " json_extract(excluded.doc, '$.first_seen_at')))"
)


def upsert_sql(table: str, namespace: str, count: int) -> str:
    """The upsert of ``count`` rows of (_id, doc, namespace); into ``items``, each row also
    takes the namespace's next change sequence: one value above every committed one, read in
    the writing statement itself, under the write lock, so commit order is sequence order."""
    values = ",".join(["(?, ?, ?)"] * count)
    tail = _UPSERT_TAIL.format(table=table)
    if table != "items":
        return f"INSERT INTO {table} (_id, doc, namespace) VALUES {values}{tail}"
    # (WHERE true: else SQLite reads ON CONFLICT as a join's constraint)
    return (f"INSERT INTO items (_id, doc, namespace, seq) SELECT column1, column2, column3,"
            f" ({next_sequence(namespace)}) FROM (VALUES {values}) WHERE true"
            f"{tail}, seq = excluded.seq")


def next_sequence(namespace: str) -> str:
    """SQL of the namespace's next change sequence. The namespace is a literal (quotes
    doubled): the statement's parameters are all its rows'."""
    literal = "'" + namespace.replace("'", "''") + "'"
    return f"SELECT COALESCE(MAX(seq), 0) + 1 FROM items WHERE namespace = {literal}"


def export_rows(conn: sqlite3.Connection, namespace: str, after: tuple[int, str] | None,
                limit: int, site_id: str | None, seed_id: str | None
                ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
    """A page of the namespace's documents in change order, after position ``after``."""
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


__all__ = ["ANOMALIES", "FIELD", "INDEXES", "add_change_sequence", "create_schema",
           "export_rows", "migrate_table", "next_sequence", "upsert_sql"]

"""The SQLite store's tables and indexes, and the rebuild of tables from before namespaces."""

from __future__ import annotations

import logging
import sqlite3

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
    "items_changes": ("seq, _id", ""),  # the export's change order (sqlite_export.py)
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


__all__ = ["ANOMALIES", "FIELD", "INDEXES", "add_change_sequence", "create_schema", "migrate_table"]

"""PostgreSQL store (``postgresql://`` or ``postgres://`` URIs, through psycopg 3).

Schema (created on first use, under an advisory lock: workers starting together do not race)::

    CREATE TABLE items (
        namespace text  NOT NULL,   -- METEORSEED_NAMESPACE: namespaces sharing a database
        _id       text  NOT NULL,   -- "<site_id>:<unique_key>"
        doc       jsonb NOT NULL,   -- the whole document, "_id" included
        PRIMARY KEY (namespace, _id)
    );

``anomalies`` has the same shape. Indexes (see :data:`INDEXES`) answer "a site's documents by
time", "a seed's documents", "documents with this content fingerprint" and the retention's
"older than".

- One batch, one statement, its own transaction (autocommit: one round trip): ``INSERT …
  SELECT FROM jsonb_array_elements(<the batch as one JSON array>) ON CONFLICT (namespace, _id)
  DO UPDATE`` that keeps the stored ``first_seen_at``, committed before the call returns (the
  task is acked after that). Duplicates are folded first (one statement may not update a row
  twice) and rows go in ``_id`` order (workers sharing documents never deadlock).
- The connection is opened lazily by the thread that first uses it (the pipeline's single store
  thread) and dropped after any error that is not a refused document.
- Errors are classified by SQLSTATE class: data exceptions (22: a NUL in a string, a number out
  of range), integrity violations (23) and program limits (54: a document too large) are the
  document's; everything else (no connection, authentication, a full disk, a read-only server,
  shutdown, missing privileges) is an outage, :class:`StoreUnavailable`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import psycopg

from meteorseed_scrapy.store.base import Store, StoreUnavailable
from meteorseed_scrapy.store.documents import last_wins
from meteorseed_scrapy.store.postgres_export import (
    ADD_CHANGE_COLUMN,
    CHANGE_ON_UPDATE,
    export_query,
)

_T = TypeVar("_T")

CONNECT_TIMEOUT = 5
_CONNECTION_DEFAULTS = {"connect_timeout": CONNECT_TIMEOUT, "keepalives_idle": 10,
                        "keepalives_interval": 5, "keepalives_count": 3,
                        "tcp_user_timeout": 30_000}
ANOMALIES = "anomalies"
#: SQLSTATE classes a document can cause; the rest are the store's (outages).
_DOCUMENT_CLASSES = frozenset({"22", "23", "54"})
_SCHEMA_LOCK = 0x6D657465  # pg_advisory_xact_lock key: schema creation, one worker at a time
_TABLE = ("CREATE TABLE IF NOT EXISTS {t} (namespace text NOT NULL, _id text NOT NULL,"
          " doc jsonb NOT NULL, PRIMARY KEY (namespace, _id))")
#: name -> indexed expressions of ``items`` (each led by the namespace).
INDEXES = {
    "items_site_time": "(doc->>'site_id'), (doc->>'updated_at')",
    # A seed's documents in _id order (paging by a stable cursor: seed_items_page).
    "items_seed_page": "(doc->>'seed_id'), _id COLLATE \"C\"",
    "items_fingerprint": "(doc->>'content_fingerprint')",
    "items_updated": "(doc->>'updated_at')",
    "items_changes": 'xid, _id COLLATE "C"',  # the export's change order (postgres_export.py)
}
_BY_ID = 'ORDER BY _id COLLATE "C"'  # byte order, as SQLite and MongoDB sort, whatever the locale
_UPSERT = (
    "INSERT INTO {t} AS old (namespace, _id, doc)"
    " SELECT %s, d->>'_id', d FROM jsonb_array_elements(%s::text::jsonb) AS d"
    " ON CONFLICT (namespace, _id) DO UPDATE SET doc = excluded.doc || jsonb_build_object("
    "'first_seen_at', COALESCE(old.doc->'first_seen_at', excluded.doc->'first_seen_at'))"
)


def document_error(exc: BaseException) -> bool:
    """True when ``exc`` is about the document written, not about the store (an outage)."""
    if not isinstance(exc, psycopg.Error):
        return True
    return (exc.sqlstate or "")[:2] in _DOCUMENT_CLASSES


def _shown(uri: str) -> str:
    parts = urlsplit(uri)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"


class PostgresStore(Store):
    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_uri(cls, uri: str) -> PostgresStore:
        return cls(uri)

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        options = {key.lower() for key in parse_qs(urlsplit(self.uri).query)}
        # Unless the URI says otherwise: a server that vanished without a word (host down, a
        # partition) fails the write within about half a minute instead of TCP's 15 minutes.
        kwargs: dict[str, Any] = {k: v for k, v in _CONNECTION_DEFAULTS.items()
                                  if k not in options}
        # Autocommit: a batch is one statement, atomic by itself, committed in the same round
        # trip (a BEGIN … COMMIT costs two, each a GIL hand-off while the reactor is busy).
        conn = psycopg.connect(self.uri, autocommit=True, **kwargs)
        try:
            self._create_schema(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    @staticmethod
    def _create_schema(conn: psycopg.Connection[Any]) -> None:
        """Create the tables and indexes that are missing, only those: a role that may only
        read and write the tables a DBA created (no CREATE on the schema, as PostgreSQL 15
        grants by default) works too."""
        wanted = ["items", ANOMALIES, *INDEXES]
        lookup = "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regclass(name) IS NULL"
        if not conn.execute(lookup, (wanted,)).fetchall():
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            missing = {row[0] for row in conn.execute(lookup, (wanted,))}
            for table in ("items", ANOMALIES):
                if table in missing:
                    conn.execute(_TABLE.format(t=table).encode())
            if "items_changes" in missing:
                conn.execute(ADD_CHANGE_COLUMN.encode())
            for name, expressions in INDEXES.items():
                if name in missing:
                    conn.execute(f"CREATE INDEX IF NOT EXISTS {name} ON items"
                                 f" (namespace, {expressions})".encode())

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def _run(self, work: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        """Run ``work(conn)`` (one statement: its own transaction); an outage becomes
        :class:`StoreUnavailable`."""
        with self._lock:
            try:
                return work(self._connect())
            except psycopg.Error as exc:
                if document_error(exc) and self._conn is not None and not self._conn.broken:
                    raise  # (the transaction was rolled back: the connection is usable)
                self._drop_connection()
                if document_error(exc):
                    raise
                raise StoreUnavailable(f"PostgreSQL {_shown(self.uri)}: {exc}") from exc

    # -- writes -------------------------------------------------------------------------

    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        self._upsert("items", docs)

    def upsert_anomalies(self, docs: list[dict[str, Any]]) -> None:
        self._upsert(ANOMALIES, docs)

    def _upsert(self, table: str, docs: list[dict[str, Any]]) -> None:
        # Rows locked in one order by every worker: batches sharing documents wait for one
        # another instead of deadlocking.
        folded = sorted(last_wins(docs), key=lambda doc: doc["_id"])
        if not folded:
            return
        # The batch as one JSON array, one parameter: psycopg's array adapter would escape
        # every document in Python (most of the write's time).
        batch = json.dumps(folded, ensure_ascii=False, separators=(",", ":"))
        sql = (_UPSERT.format(t=table) + (CHANGE_ON_UPDATE if table == "items" else "")
               ).encode()
        self._run(lambda conn: conn.execute(sql, (self.namespace, batch)))

    def purge_older_than(self, cutoff: str) -> int:
        return self._run(lambda conn: conn.execute(
            "DELETE FROM items WHERE namespace = %s AND doc->>'updated_at' < %s",
            (self.namespace, cutoff)).rowcount)

    # -- reads --------------------------------------------------------------------------

    def _rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self._run(lambda conn: conn.execute(sql.encode(), (self.namespace, *params))
                         .fetchall())

    def get(self, doc_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT doc FROM items WHERE namespace = %s AND _id = %s", doc_id)
        return dict(rows[0][0]) if rows else None

    def count(self) -> int:
        return int(self._rows("SELECT COUNT(*) FROM items WHERE namespace = %s")[0][0])

    def iter_docs(self) -> Iterator[dict[str, Any]]:
        for (doc,) in self._rows(f"SELECT doc FROM items WHERE namespace = %s {_BY_ID}"):
            yield dict(doc)

    def iter_anomalies(self) -> Iterator[dict[str, Any]]:
        for (doc,) in self._rows(f"SELECT doc FROM {ANOMALIES} WHERE namespace = %s {_BY_ID}"):
            yield dict(doc)

    def seed_items_page(self, seed_id: str, after: str | None, limit: int
                        ) -> list[dict[str, Any]]:
        rows = self._rows("SELECT doc FROM items WHERE namespace = %s AND doc->>'seed_id' = %s"
                          f' AND _id COLLATE "C" > %s {_BY_ID} LIMIT %s',
                          seed_id, after or "", limit)
        return [dict(doc) for (doc,) in rows]

    # -- export (meteorseed export) -------------------------------------------------------

    export_kind = "postgresql"

    def export_page(self, after: tuple[int, str] | None, limit: int, *,
                    site_id: str | None = None, seed_id: str | None = None
                    ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
        sql, params = export_query(self.namespace, after, limit, site_id, seed_id)
        rows = self._run(lambda conn: conn.execute(sql.encode(), params).fetchall())
        return [((int(xid), str(doc_id)), dict(doc)) for xid, doc_id, doc in rows]

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

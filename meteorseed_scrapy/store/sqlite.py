"""SQLite store: one file shared by every worker process of a machine.

Its tables, indexes, upsert statement and change sequence: :mod:`.sqlite_schema`.

- WAL journal, so readers never block the writer, and ``synchronous=FULL``: a batch reported
  committed survives power loss, not only a process crash (the task is acked right after;
  batching amortises the fsync).
- Several processes write the same file: each batch takes the write lock up front
  (``BEGIN IMMEDIATE``) and waits for it up to ``BUSY_TIMEOUT * LOCK_ATTEMPTS`` (20 s), in
  slices of ``LOCK_SLICE`` (SQLite's busy handler cannot be interrupted); only then is
  :class:`StoreUnavailable` raised (the pipeline keeps retrying for longer). Once the worker is
  stopping (:meth:`SQLiteStore.stop_waiting`), a lock held elsewhere fails the write within a
  slice: a SIGTERM never waits out another process's transaction.
- One multi-row ``INSERT ... ON CONFLICT(_id) DO UPDATE`` per chunk of rows, all chunks of a
  batch in one transaction: ``executemany`` pays a GIL hand-off per row while the reactor thread
  is busy, which made it several times slower (see design/SCRAPY_NOTES.md).
- The connection is opened lazily by the thread that first uses it (the pipeline's single store
  thread); ``check_same_thread=False`` plus a lock lets tests read from another thread.
- Errors are classified by what they are: constraint, type and size errors and values that
  cannot be bound are the document's (:func:`document_error`); every other SQLite error (full
  disk, read-only or unopenable file, I/O error, corruption, a lock held too long) is an outage,
  :class:`StoreUnavailable`, never charged to a document.
- The file is the one opened: after each write the path is checked to still name it (device
  and inode, one ``stat``); a file deleted or replaced while open raises :class:`StoreLost`
  (that batch went into the unlinked file: not committed), and no new file is created in its
  place. The group committer makes that check itself, on the event loop
  (:meth:`upsert_unconfirmed`, then :meth:`confirm_written`): a ``stat`` in the store thread
  would cost it one more wait for the GIL per batch while the reactor thread is busy.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from meteorseed_scrapy.backoff import exponential
from meteorseed_scrapy.store.base import Store, StoreLost, StoreUnavailable
from meteorseed_scrapy.store.documents import last_wins
from meteorseed_scrapy.store.sqlite_schema import (
    ANOMALIES,
    FIELD,
    create_schema,
    export_rows,
    upsert_sql,
)

_T = TypeVar("_T")

BUSY_TIMEOUT = 5.0
LOCK_ATTEMPTS = 4
#: SQLite's busy wait per try: how soon a stopping worker gives up a lock held elsewhere.
LOCK_SLICE = 0.25
#: Rows per INSERT: 3 variables each, below SQLITE_MAX_VARIABLE_NUMBER even on old builds (999).
CHUNK_ROWS = 300

# Errors worth retrying at once: another process holds the lock, or the file/disk hiccuped.
_TRANSIENT = ("locked", "busy", "disk i/o error", "unable to open database file")
# What one document can cause (a constraint, a type, a size, a value that cannot be bound).
# Checked first: these are DatabaseError subclasses too. By class, not by sqlite_errorname,
# which Python 3.10 lacks.
_DOCUMENT_ERRORS = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError,
                    sqlite3.ProgrammingError)


def sqlite_path(uri: str) -> str:
    """``sqlite:///rel/path.db`` -> ``rel/path.db``; ``sqlite:////abs/x.db`` -> ``/abs/x.db``."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or len(uri) == len(prefix):
        raise ValueError(f"METEORSEED_STORE_URI: expected sqlite:///path.db, got {uri!r}")
    return uri[len(prefix) :]


def _is_transient(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and any(
        marker in str(exc).lower() for marker in _TRANSIENT
    )


def document_error(exc: BaseException) -> bool:
    """True when ``exc`` is about the document written, not about the store (an outage)."""
    return not isinstance(exc, sqlite3.Error) or isinstance(exc, _DOCUMENT_ERRORS)


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class SQLiteStore(Store):
    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        #: (device, inode) of the file first opened; None until then, or in memory.
        self.identity: tuple[int, int] | None = None
        #: confirm_written found the file gone: the store thread drops its connection.
        self._lost = False
        self._stopping = threading.Event()

    @classmethod
    def from_uri(cls, uri: str) -> SQLiteStore:
        return cls(sqlite_path(uri))

    # -- connection ---------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            if not self._lost:
                return self._conn
            self._drop_connection()  # (then the file's check below raises StoreLost)
            self._lost = False
        if self.identity is not None:
            self._check_identity()  # (connecting would create an empty file in its place)
        elif self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        busy = min(BUSY_TIMEOUT, LOCK_SLICE)
        conn = sqlite3.connect(
            self.path, timeout=busy, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {max(1, int(busy * 1000))}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            create_schema(conn, self.namespace)
        except BaseException:
            conn.close()
            raise
        if self.identity is None and self.path != ":memory:":
            self.identity = _file_identity(self.path)
        self._conn = conn
        return conn

    def confirm_written(self) -> None:
        try:
            self._check_identity()
        except StoreLost:
            self._lost = True  # no further write into the unlinked file
            raise

    def _check_identity(self) -> None:
        """Raise :class:`StoreLost` unless the path still names the file first opened."""
        if self.identity is None:
            return
        now = _file_identity(self.path)
        if now != self.identity:
            what = "deleted" if now is None else f"replaced (inode {self.identity[1]} -> {now[1]})"
            raise StoreLost(
                f"SQLite {self.path}: the database file was {what} while this worker had it "
                "open; what it wrote since is not in the file readers open. Restart the worker "
                "to use the file now at that path"
            )

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def stop_waiting(self) -> None:
        self._stopping.set()

    def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work(conn)`` under the lock, retrying transient errors a few times and a lock
        held elsewhere for up to ``BUSY_TIMEOUT * LOCK_ATTEMPTS``."""
        streak = 0  # transient errors in a row, a lock ends it: the pause doubles with them
        lock_deadline = time.monotonic() + BUSY_TIMEOUT * LOCK_ATTEMPTS
        attempt = 0
        with self._lock:
            while True:
                attempt += 1
                try:
                    return work(self._connect())
                except StoreLost:
                    self._drop_connection()  # no more writes into the unlinked file
                    raise
                except OSError as exc:  # (stat, mkdir: the file system's trouble, not a doc's)
                    self._drop_connection()
                    raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc
                except sqlite3.Error as exc:
                    if document_error(exc):
                        raise
                    message = str(exc).lower()
                    locked = "locked" in message or "busy" in message
                    if not locked:
                        self._drop_connection()  # I/O trouble: start afresh next time
                    if not _is_transient(exc):  # full, read-only, corrupt: the caller backs off
                        raise StoreUnavailable(f"SQLite {self.path}: {exc}") from exc
                    if locked and self._stopping.is_set():
                        raise StoreUnavailable(
                            f"SQLite {self.path}: {exc}, held by another process; not waiting"
                            " for it: this worker is stopping") from exc
                    if (time.monotonic() >= lock_deadline) if locked \
                            else attempt >= LOCK_ATTEMPTS:
                        raise StoreUnavailable(
                            f"SQLite {self.path}: {exc} (after {attempt} attempts)"
                        ) from exc
                    self._stopping.wait(exponential(streak, 0.05, 1.0, jitter=(0.5, 1.5)))
                    streak = 0 if locked else streak + 1

    # -- writes -------------------------------------------------------------------------

    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        self._upsert("items", docs)

    def upsert_unconfirmed(self, docs: list[dict[str, Any]]) -> None:
        self._upsert("items", docs, confirm=False)

    def upsert_anomalies(self, docs: list[dict[str, Any]]) -> None:
        self._upsert(ANOMALIES, docs)

    def _upsert(self, table: str, docs: list[dict[str, Any]], confirm: bool = True) -> None:
        rows = [
            (doc["_id"], json.dumps(doc, ensure_ascii=False, separators=(",", ":")),
             self.namespace)
            for doc in last_wins(docs)
        ]
        if not rows:
            return

        def write(conn: sqlite3.Connection) -> None:
            if len(rows) <= CHUNK_ROWS:
                # One statement is its own (atomic) transaction in autocommit mode: one
                # sqlite3_step, so this thread takes the GIL back once instead of three times
                # (BEGIN, INSERT, COMMIT), each a wait of up to the switch interval while the
                # reactor thread is busy.
                conn.execute(upsert_sql(table, self.namespace, len(rows)),
                             [value for row in rows for value in row])
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                for start in range(0, len(rows), CHUNK_ROWS):
                    chunk = rows[start : start + CHUNK_ROWS]
                    params = [value for row in chunk for value in row]
                    conn.execute(upsert_sql(table, self.namespace, len(chunk)), params)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        def write_checked(conn: sqlite3.Connection) -> None:
            write(conn)
            self._check_identity()  # committed into the file readers open, or not at all

        self._run(write_checked if confirm else write)

    def purge_older_than(self, cutoff: str) -> int:
        return self._run(lambda conn: conn.execute(
            f"DELETE FROM items WHERE namespace = ? AND {FIELD.format('updated_at')} < ?",
            (self.namespace, cutoff)).rowcount)

    # -- reads --------------------------------------------------------------------------

    def _rows(self, sql: str, *params: Any) -> list[Any]:
        return self._run(lambda conn: conn.execute(sql, (self.namespace, *params)).fetchall())

    def get(self, doc_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT doc FROM items WHERE namespace = ? AND _id = ?", doc_id)
        return dict(json.loads(rows[0][0])) if rows else None

    def count(self) -> int:
        return int(self._rows("SELECT COUNT(*) FROM items WHERE namespace = ?")[0][0])

    def iter_docs(self) -> Iterator[dict[str, Any]]:
        for (doc,) in self._rows("SELECT doc FROM items WHERE namespace = ? ORDER BY _id"):
            yield json.loads(doc)

    def iter_anomalies(self) -> Iterator[dict[str, Any]]:
        for (doc,) in self._rows(f"SELECT doc FROM {ANOMALIES} WHERE namespace = ? ORDER BY _id"):
            yield json.loads(doc)

    def seed_items_page(self, seed_id: str, after: str | None, limit: int
                        ) -> list[dict[str, Any]]:
        rows = self._rows(
            f"SELECT doc FROM items WHERE namespace = ? AND {FIELD.format('seed_id')} = ?"
            " AND _id > ? ORDER BY _id LIMIT ?", seed_id, after or "", limit)
        return [json.loads(doc) for (doc,) in rows]

    # -- export (meteorseed export) -------------------------------------------------------

    export_kind = "sqlite"

    def export_page(self, after: tuple[int, str] | None, limit: int, *,
                    site_id: str | None = None, seed_id: str | None = None
                    ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
        return self._run(lambda conn: export_rows(conn, self.namespace, after, limit,
                                                  site_id, seed_id))

    def close(self) -> None:
        with self._lock:
            self._drop_connection()

"""The page cache in an SQL database: table ``pages`` next to ``items`` (SQLite, PostgreSQL).

::

    CREATE TABLE pages (
        namespace  TEXT NOT NULL,
        key        TEXT NOT NULL,     -- "<site_id>:<sha256 of the canonical URL>"
        site_id    TEXT NOT NULL,
        fetched_at TEXT NOT NULL,     -- utc_timestamp: sorts by time
        size       INTEGER NOT NULL,  -- len(data): the bound is on compressed bytes
        data       BLOB NOT NULL,     -- (bytea) see store/page_cache.py
        PRIMARY KEY (namespace, key)
    );  -- + indexes (namespace, site_id, fetched_at, key) and (namespace, fetched_at)

Its own connection, not the item store's: a cache write never waits behind (or holds up) a
batch of items, and a cache that fails leaves the items alone.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meteorseed_scrapy.store.page_cache import CacheRow, PageCache
from meteorseed_scrapy.store.sqlite import BUSY_TIMEOUT, sqlite_path

_COLUMNS = "namespace, key, site_id, fetched_at, size, data"
_CHUNK = 500  # keys per DELETE


class SQLPageCache(PageCache):
    """Both dialects: ``mark`` is the parameter marker, ``blob`` the binary column type."""

    def __init__(self, connect: Callable[[], Any], mark: str, blob: str, shown: str) -> None:
        self._connect_fn = connect
        self._mark = mark
        self._blob = blob
        self.shown = shown
        self._conn: Any = None
        self._lock = threading.Lock()

    def _sql(self, text: str) -> str:
        return text.replace("?", self._mark)

    def _connection(self) -> Any:
        if self._conn is None:
            conn = self._connect_fn()
            try:
                for statement in (
                    "CREATE TABLE IF NOT EXISTS pages (namespace TEXT NOT NULL, key TEXT NOT"
                    " NULL, site_id TEXT NOT NULL, fetched_at TEXT NOT NULL, size INTEGER NOT"
                    f" NULL, data {self._blob} NOT NULL, PRIMARY KEY (namespace, key))",
                    "CREATE INDEX IF NOT EXISTS pages_site_time ON pages"
                    " (namespace, site_id, fetched_at, key)",
                    "CREATE INDEX IF NOT EXISTS pages_time ON pages (namespace, fetched_at)",
                ):
                    conn.execute(statement)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _run(self, work: Callable[[Any], Any]) -> Any:
        with self._lock:
            try:
                return work(self._connection())
            except BaseException:
                if self._conn is not None:  # start afresh: a broken connection stays broken
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None
                raise

    def put(self, entries: list[CacheRow]) -> None:
        if not entries:
            return
        last = {entry.key: entry for entry in entries}  # one row per key and statement
        rows = [(self.namespace, e.key, e.site_id, e.fetched_at, len(e.data), e.data)
                for e in last.values()]
        values = ",".join(["(?, ?, ?, ?, ?, ?)"] * len(rows))
        sql = self._sql(f"INSERT INTO pages ({_COLUMNS}) VALUES {values} ON CONFLICT"
                        " (namespace, key) DO UPDATE SET site_id = excluded.site_id,"
                        " fetched_at = excluded.fetched_at, size = excluded.size,"
                        " data = excluded.data")
        self._run(lambda conn: conn.execute(sql, [v for row in rows for v in row]))

    def scan(self, site_id: str, since: str, after: tuple[str, str] | None,
             limit: int) -> list[CacheRow]:
        params: list[Any] = [self.namespace, site_id, since]
        where = ""
        if after is not None:
            where = " AND (fetched_at > ? OR (fetched_at = ? AND key > ?))"
            params += [after[0], after[0], after[1]]
        sql = self._sql("SELECT key, site_id, fetched_at, data FROM pages WHERE namespace = ?"
                        f" AND site_id = ? AND fetched_at >= ?{where}"
                        f" ORDER BY fetched_at, key LIMIT {int(limit)}")
        rows = self._run(lambda conn: conn.execute(sql, params).fetchall())
        return [CacheRow(str(k), str(s), str(t), bytes(d)) for k, s, t, d in rows]

    def usage(self) -> tuple[int, int]:
        sql = self._sql("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM pages WHERE namespace = ?")
        count, size = self._run(lambda conn: conn.execute(sql, [self.namespace]).fetchone())
        return int(count), int(size)

    def evict(self, older_than: str, max_bytes: int) -> int:
        def work(conn: Any) -> int:
            gone = int(conn.execute(self._sql(
                "DELETE FROM pages WHERE namespace = ? AND fetched_at < ?"),
                [self.namespace, older_than]).rowcount or 0)
            total = int(conn.execute(self._sql(
                "SELECT COALESCE(SUM(size), 0) FROM pages WHERE namespace = ?"),
                [self.namespace]).fetchone()[0])
            if total <= max_bytes:
                return gone
            victims: list[str] = []
            for key, size in conn.execute(self._sql(
                    "SELECT key, size FROM pages WHERE namespace = ? ORDER BY fetched_at, key"),
                    [self.namespace]).fetchall():
                if total <= max_bytes:
                    break
                victims.append(key)
                total -= int(size)
            for start in range(0, len(victims), _CHUNK):
                chunk = victims[start:start + _CHUNK]
                conn.execute(self._sql("DELETE FROM pages WHERE namespace = ? AND key IN"
                                       f" ({','.join('?' * len(chunk))})"),
                             [self.namespace, *chunk])
            return gone + len(victims)

        return int(self._run(work))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def _sqlite(path: str) -> Callable[[], Any]:
    def connect() -> sqlite3.Connection:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            # A cache: losing the last writes to a power cut costs a re-fetch, not an item.
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    return connect


def _postgres(uri: str) -> Callable[[], Any]:
    def connect() -> Any:
        import psycopg

        from meteorseed_scrapy.store.postgres import CONNECT_TIMEOUT

        return psycopg.connect(uri, autocommit=True, connect_timeout=CONNECT_TIMEOUT)

    return connect


def open_sql_cache(uri: str) -> SQLPageCache:
    if uri.partition("://")[0].lower() == "sqlite":
        path = sqlite_path(uri)
        return SQLPageCache(_sqlite(path), "?", "BLOB", f"SQLite {path}")
    return SQLPageCache(_postgres(uri), "%s", "BYTEA", f"PostgreSQL {uri.rpartition('@')[2]}")


__all__ = ["SQLPageCache", "open_sql_cache"]

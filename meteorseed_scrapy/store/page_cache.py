"""The raw-page cache: pages a rule site fetched, kept compressed so that the site's current
rules can run over them again (``meteorseed sites reparse``) without sending a request.

One cache entry per page, keyed ``<site_id>:<SHA-256 of the canonical page URL>`` (a page
fetched again replaces its entry). An entry is one zlib stream of a JSON envelope (URL,
status, headers, when fetched, the callback and meta the rule spider parsed it with, the
task's ids and URL, which the stored documents' identity needs), a newline, then the body as
received: one blob, so that a torn or corrupted entry fails as a whole (:class:`CorruptPage`)
instead of yielding a page with the wrong headers.

Entries live in the store's database by default, shared by the fleet as the items are: a table
``pages`` (SQLite, PostgreSQL; :mod:`.page_cache_sql`) or the namespace's collection ``pages``
(MongoDB, ``<ns>.pages`` for a namespace other than the default; :mod:`.page_cache_mongo`);
or in the database ``METEORSEED_PAGE_CACHE_URI`` names.
The bound is per namespace: entries older than the maximum age go first, then the oldest until
the compressed bytes fit (:meth:`PageCache.evict`).
"""

from __future__ import annotations

import json
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from meteorseed_scrapy.store.base import DEFAULT_NAMESPACE
from meteorseed_scrapy.task.canonical import url_hash
from meteorseed_scrapy.task.json_depth import loads_bounded

FORMAT = 1
#: Level 6 (zlib's default): HTML shrinks 5-10x; level 1 saves little CPU and a third of it.
LEVEL = 6
#: Bodies larger than this (decompressed) are refused when read back: a corrupted or hostile
#: entry must not inflate into gigabytes (Scrapy's own DOWNLOAD_MAXSIZE is 32 MiB here).
MAX_BODY = 64 * 1024 * 1024


class CorruptPage(ValueError):
    """A cache entry that cannot be read back (truncated, not zlib, a bad envelope)."""


@dataclass(frozen=True)
class CachedPage:
    site_id: str
    url: str
    status: int
    headers: dict[str, list[str]]
    body: bytes
    fetched_at: str  # store.documents.utc_timestamp
    callback: str  # the rule spider's callback that parsed it
    meta: dict[str, Any] = field(default_factory=dict)  # sites_page / sites_depth
    task: dict[str, Any] = field(default_factory=dict)  # task_id, seed_id, url (the task's)

    @property
    def key(self) -> str:
        return page_key(self.site_id, self.url)


def page_key(site_id: str, url: str) -> str:
    return f"{site_id}:{url_hash(url)}"


@dataclass(frozen=True)
class CacheRow:
    """One row of the cache: what the back ends store and return."""

    key: str
    site_id: str
    fetched_at: str
    data: bytes


def encode(page: CachedPage) -> CacheRow:
    envelope = {"v": FORMAT, "site_id": page.site_id, "url": page.url, "status": page.status,
                "headers": page.headers, "fetched_at": page.fetched_at,
                "callback": page.callback, "meta": page.meta, "task": page.task}
    head = json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return CacheRow(page.key, page.site_id, page.fetched_at,
                 zlib.compress(head + b"\n" + page.body, LEVEL))


def decode(data: bytes) -> CachedPage:
    """The page of an entry, or :class:`CorruptPage` saying what is wrong with it."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(bytes(data), MAX_BODY + 1)
    except zlib.error as exc:
        raise CorruptPage(f"not a zlib stream: {exc}") from None
    if len(raw) > MAX_BODY:
        raise CorruptPage(f"larger than {MAX_BODY} bytes decompressed")
    if not inflater.eof:
        raise CorruptPage("truncated (the compressed stream does not end)")
    head, sep, body = raw.partition(b"\n")
    if not sep:
        raise CorruptPage("no envelope line")
    try:
        env = loads_bounded("", head)
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptPage(f"envelope: {exc}") from None
    if not isinstance(env, dict) or env.get("v") != FORMAT:
        raise CorruptPage(f"envelope: not format {FORMAT}")
    try:
        page = CachedPage(site_id=env["site_id"], url=env["url"], status=env["status"],
                          headers=env["headers"], body=body, fetched_at=env["fetched_at"],
                          callback=env["callback"], meta=env["meta"], task=env["task"])
    except KeyError as exc:
        raise CorruptPage(f"envelope: no {exc.args[0]}") from None
    for name, kind in (("site_id", str), ("url", str), ("status", int), ("headers", dict),
                       ("fetched_at", str), ("callback", str), ("meta", dict), ("task", dict)):
        if not isinstance(getattr(page, name), kind):
            raise CorruptPage(f"envelope: {name} is not a {kind.__name__}")
    return page


class PageCache(ABC):
    """Where entries are kept; synchronous and blocking (called from one thread)."""

    namespace: str = DEFAULT_NAMESPACE

    @abstractmethod
    def put(self, entries: list[CacheRow]) -> None:
        """Write entries, each replacing the one of its key."""

    @abstractmethod
    def scan(self, site_id: str, since: str, after: tuple[str, str] | None,
             limit: int) -> list[CacheRow]:
        """Up to ``limit`` entries of ``site_id`` fetched at or after ``since``, in
        (fetched_at, key) order, after the position ``after`` (keyset paging)."""

    @abstractmethod
    def usage(self) -> tuple[int, int]:
        """(entries, compressed bytes) of the namespace."""

    @abstractmethod
    def evict(self, older_than: str, max_bytes: int) -> int:
        """Delete entries fetched before ``older_than``, then the oldest until the namespace
        holds at most ``max_bytes``; how many were deleted."""

    @abstractmethod
    def close(self) -> None: ...

    def pages(self, site_id: str, since: str, batch: int = 200) -> Iterator[CacheRow]:
        """Every entry of ``site_id`` fetched since ``since``, oldest first, ``batch`` rows
        read at a time (a cache of gigabytes is never loaded whole)."""
        after: tuple[str, str] | None = None
        while True:
            rows = self.scan(site_id, since, after, batch)
            yield from rows
            if len(rows) < batch:
                return
            after = (rows[-1].fetched_at, rows[-1].key)


_SQL = ("sqlite", "postgresql", "postgres")
_MONGO = ("mongodb", "mongodb+srv", "mongomock")


def check_cache_uri(uri: str) -> str:
    """``uri`` if a page cache can live in its database, else ``ValueError`` naming
    ``METEORSEED_PAGE_CACHE_URI`` (no I/O)."""
    scheme = uri.partition("://")[0].lower() if "://" in uri else ""
    if scheme not in _SQL + _MONGO:
        shown = uri.rpartition("@")[2]  # never echo a password
        raise ValueError(f"METEORSEED_PAGE_CACHE_URI: unsupported database {shown!r}; expected"
                         " sqlite:///path.db, postgresql://… or mongodb://…")
    if scheme == "sqlite":
        from meteorseed_scrapy.store.sqlite import sqlite_path

        try:
            sqlite_path(uri)
        except ValueError as exc:
            raise ValueError(str(exc).replace("METEORSEED_STORE_URI",
                                              "METEORSEED_PAGE_CACHE_URI")) from None
    return scheme


def open_page_cache(uri: str, namespace: str = DEFAULT_NAMESPACE) -> PageCache:
    """The cache in the database of ``uri`` (SQLite, PostgreSQL: a table ``pages``; MongoDB:
    the namespace's collection ``pages``, :mod:`.mongo_layout`); ``ValueError`` naming
    ``METEORSEED_PAGE_CACHE_URI`` for any other. Imported on use: users of one database need
    not install the others'."""
    cache: PageCache
    if check_cache_uri(uri) in _SQL:
        from meteorseed_scrapy.store.page_cache_sql import open_sql_cache

        cache = open_sql_cache(uri)
    else:
        from meteorseed_scrapy.store.page_cache_mongo import open_mongo_cache

        cache = open_mongo_cache(uri)
    cache.namespace = namespace
    return cache


__all__ = [
    "CacheRow",
    "CachedPage",
    "CorruptPage",
    "PageCache",
    "check_cache_uri",
    "decode",
    "encode",
    "open_page_cache",
    "page_key",
]

"""The document store behind the upsert pipeline, chosen by the scheme of
``METEORSEED_STORE_URI``.

- ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` -> :class:`SQLiteStore`
- ``mongodb://…`` / ``mongodb+srv://…`` -> :class:`MongoStore`
- ``postgresql://…`` / ``postgres://…`` -> :class:`PostgresStore` (needs the ``postgres`` extra)
- ``mongomock://<name>/<db>`` -> :class:`MongoStore` over an in-process mongomock-ng server
  (tests only; needs the ``dev`` extra)

Opening a store does no I/O: each back end connects on first use. A store reads and writes
the documents of one namespace (``METEORSEED_NAMESPACE``); with ``retention`` (seconds, see
:mod:`~meteorseed_scrapy.store.retention`; only the store stage passes it) it deletes those not
updated for that long.
"""

from __future__ import annotations

from meteorseed_scrapy.store.base import DEFAULT_NAMESPACE, Store
from meteorseed_scrapy.store.retention import bind
from meteorseed_scrapy.store.sqlite import SQLiteStore, sqlite_path

_SCHEMES = ("sqlite", "mongodb", "mongodb+srv", "mongomock", "postgresql", "postgres")
POSTGRES_SCHEMES = ("postgresql", "postgres")


def _scheme(uri: str) -> str:
    scheme, sep, _ = uri.partition("://")
    return scheme.lower() if sep else ""


def check_store_uri(uri: str) -> str:
    """Return ``uri`` if its scheme names a known store, else raise ``ValueError``."""
    if _scheme(uri) not in _SCHEMES:
        shown = uri.split("@")[-1] if "@" in uri else uri  # never echo a password
        raise ValueError(
            f"METEORSEED_STORE_URI: unsupported store {shown!r}; expected sqlite:///path.db, "
            "postgresql://user@host/db, mongodb://host/db or mongodb+srv://host/db"
        )
    if _scheme(uri) == "sqlite":
        sqlite_path(uri)  # rejects "sqlite://" without a path now, not at the first write
    return uri


def open_store(uri: str, namespace: str = DEFAULT_NAMESPACE,
               retention: float | None = None) -> Store:
    """The store for ``uri`` (see the module docstring); unknown schemes raise ``ValueError``."""
    scheme = _scheme(check_store_uri(uri))
    store: Store
    if scheme == "sqlite":
        store = SQLiteStore.from_uri(uri)
    elif scheme in POSTGRES_SCHEMES:
        # Imported here: users of other stores need not install psycopg, nor pymongo.
        from meteorseed_scrapy.store.postgres import PostgresStore

        store = PostgresStore.from_uri(uri)
    else:
        from meteorseed_scrapy.store.mongo import MongoStore
        from meteorseed_scrapy.store.mongo_layout import ITEMS, collection_name

        collection_name(namespace, ITEMS)  # a namespace MongoDB refuses: now, not at a write
        store = MongoStore.from_uri(uri)
    return bind(store, namespace, retention)

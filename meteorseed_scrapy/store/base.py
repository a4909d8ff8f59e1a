"""The upsert contract shared by every store back end.

An upsert replaces the whole document (its shape: :mod:`.documents`; fields the latest item
lacks disappear) except ``first_seen_at``, which keeps the value of the first write. Store
methods are synchronous and blocking: the pipeline calls them from one worker thread, never
from the reactor thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from meteorseed_scrapy.settings import DEFAULTS


class StoreUnavailable(Exception):
    """The store cannot take any write right now (unreachable, busy, full, read-only, refusing
    our credentials): an outage, never charged to the documents; the same write may be
    retried."""


class StoreLost(StoreUnavailable):
    """The store open in this worker is no longer the one its URI names (an SQLite file
    deleted or replaced while open): retrying cannot help, and what was written since is not
    where readers look."""


#: The namespace a store opened without one reads and writes.
DEFAULT_NAMESPACE: str = DEFAULTS["METEORSEED_NAMESPACE"]


class Store(ABC):
    """A keyed document store with idempotent batch upserts.

    Documents belong to :attr:`namespace` (set before the first call): namespaces sharing one
    database keep their own documents, each namespace's ``_id`` unique.
    """

    namespace: str = DEFAULT_NAMESPACE

    @abstractmethod
    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        """Write one batch (all or nothing where the back end allows it).

        Later documents win over earlier ones with the same ``_id``. Raises
        :class:`StoreUnavailable` on connection-type failures: the caller may retry the batch.
        """

    def upsert_unconfirmed(self, docs: list[dict[str, Any]]) -> None:
        """:meth:`upsert_many` without the check some back ends make after it that the batch
        went where readers look (SQLite: the file is still the one at its path). The caller
        runs :meth:`confirm_written` before relying on the batch: on the event loop, it costs
        the store thread no further hand-off of the GIL."""
        self.upsert_many(docs)

    def confirm_written(self) -> None:
        """Raise :class:`StoreLost` unless what :meth:`upsert_unconfirmed` wrote is where
        readers look (safe on any thread)."""
        return None  # (a back end whose writes land where its readers look)

    @abstractmethod
    def get(self, doc_id: str) -> dict[str, Any] | None: ...

    @abstractmethod
    def count(self) -> int: ...

    @abstractmethod
    def iter_docs(self) -> Iterator[dict[str, Any]]:
        """Every stored document (for tests and the demo summary; not for hot paths)."""

    @abstractmethod
    def close(self) -> None: ...

    def keep_for(self, seconds: float) -> bool:
        """True when this back end deletes documents not updated for ``seconds`` by itself
        (MongoDB's TTL index; 0: no longer); else the store stage purges them
        (:mod:`.retention`)."""
        return False

    def purge_older_than(self, cutoff: str) -> int:
        """Delete the namespace's documents whose ``updated_at`` is before ``cutoff`` (a
        :func:`.documents.utc_timestamp`); how many were."""
        raise NotImplementedError(f"{type(self).__name__} keeps no retention")

    def stop_waiting(self) -> None:
        """The worker is stopping: from now on, fail at once instead of waiting for a lock
        another process holds (called from another thread than the writes')."""
        return None  # (a back end that waits for no lock of another process)

    #: The kind of :meth:`export_page` positions (:mod:`.export_cursor`); "" when it has none.
    export_kind: str = ""

    def export_page(self, after: tuple[int, str] | None, limit: int, *,
                    site_id: str | None = None, seed_id: str | None = None
                    ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
        """Up to ``limit`` of the namespace's documents after change position ``after`` (None:
        from the first), in change order, each with its position (``meteorseed export``).

        A position is ``(sequence, _id)``; a write moves a document to a sequence above every
        position a reader was given before it (a changed document comes again, an unchanged
        one never). ``site_id`` / ``seed_id`` keep only the documents that have them."""
        raise NotImplementedError(f"{type(self).__name__} keeps no change order")

    def seed_items_page(self, seed_id: str, after: str | None, limit: int
                        ) -> list[dict[str, Any]]:
        """A seed's documents in ``_id`` order (bytewise), the first ``limit`` after the ``_id``
        ``after`` (None: from the first): a stable cursor for paging (``GET
        /seeds/{id}/items``). The back ends answer it from an index on (seed_id, _id); this
        default scans (test doubles)."""
        docs = sorted((d for d in self.iter_docs() if d.get("seed_id") == seed_id),
                      key=lambda d: str(d["_id"]).encode("utf-8"))
        if after is not None:
            docs = [d for d in docs if str(d["_id"]).encode("utf-8") > after.encode("utf-8")]
        return docs[:limit]

    # Anomalies: items that failed their site's validation, kept apart from ``items`` with
    # their reasons (same upsert rules: last wins, first_seen_at kept). Concrete here, not
    # abstract, so stores that keep no anomalies (test doubles) need not implement them.
    def upsert_anomalies(self, docs: list[dict[str, Any]]) -> None:
        raise NotImplementedError(f"{type(self).__name__} keeps no anomalies")

    def iter_anomalies(self) -> Iterator[dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} keeps no anomalies")

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

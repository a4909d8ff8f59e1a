"""The upsert contract shared by every store back end, and the stored document shape.

A stored document is the item's own fields plus bookkeeping::

    {"_id": "<site_id>:<unique_key>", <item fields...>, "site_id": ..., "url": ...,
     "seed_id": ..., "task_id": ..., "updated_at": "<ISO-8601 UTC>", "first_seen_at": "<...>"}

An upsert replaces the whole document (fields the latest item lacks disappear) except
``first_seen_at``, which keeps the value of the first write. Store methods are synchronous
and blocking: the pipeline calls them from one worker thread, never from the reactor thread.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

from meteorseed_scrapy.settings import DEFAULTS

#: Bookkeeping fields the store stage sets; an item may carry them only with the same value.
RESERVED_FIELDS = ("_id", "site_id", "seed_id", "task_id", "updated_at", "first_seen_at")
_MAX_UNIQUE_KEY = 1000


class StoreUnavailable(Exception):
    """The store cannot take any write right now (unreachable, busy, full, read-only, refusing
    our credentials): an outage, never charged to the documents; the same write may be
    retried."""


class StoreLost(StoreUnavailable):
    """The store open in this worker is no longer the one its URI names (an SQLite file
    deleted or replaced while open): retrying cannot help, and what was written since is not
    where readers look."""


class DocumentError(ValueError):
    """An item cannot become a stored document; ``field`` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


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
        :func:`utc_timestamp`); how many were."""
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


def utc_timestamp(now: datetime | None = None) -> str:
    """ISO-8601 UTC with microseconds and a ``Z``: one fixed width, so strings sort by time."""
    moment = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    # (not strftime's %Y: it does not pad years below 1000 on glibc, which breaks the sort)
    return f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%S.%fZ")


def check_unique_key(value: Any) -> str:
    """The ``unique_key`` of an item as a string, or :class:`DocumentError`."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DocumentError("unique_key", f"must be a non-empty string, got {value!r}"[:300])
    if len(value) > _MAX_UNIQUE_KEY:
        raise DocumentError("unique_key", f"must be at most {_MAX_UNIQUE_KEY} characters")
    return value


def _plain(path: str, value: Any) -> Any:
    # Checked by hand rather than by json.dumps: one clear error naming the field, the same
    # for every store (json.dumps would quietly turn int keys into strings).
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DocumentError(path, f"must be a finite number, got {value!r}")
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(f"{path}[{index}]", element) for index, element in enumerate(value)]
    if isinstance(value, Mapping):
        return {_check_key(path, key): _plain(f"{path}.{key}", v) for key, v in value.items()}
    raise DocumentError(path, f"is not JSON-serialisable ({type(value).__name__})")


def _check_key(parent: str, key: Any) -> str:
    where = f"{parent}.{key}" if parent else str(key)
    if not isinstance(key, str) or not key:
        raise DocumentError(where, f"field names must be non-empty strings, got {key!r}")
    if key.startswith("$") or "\0" in key:
        # MongoDB reserves "$"-prefixed names; rejecting them everywhere keeps stores alike.
        raise DocumentError(where, "field names must not start with '$' or contain NUL")
    return key


def check_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-JSON copy of an item's fields (tuples become lists, mappings dicts), or
    :class:`DocumentError` naming the first field that cannot be stored as JSON."""
    return {_check_key("", key): _plain(key, value) for key, value in fields.items()}


def canonical_json(fields: Mapping[str, Any]) -> str:
    """Stable text of an item's fields (sorted keys, no spaces): equal items, equal text."""
    return json.dumps(
        fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def build_document(
    item: Mapping[str, Any],
    *,
    site_id: str,
    url: str | None,
    seed_id: str | None,
    task_id: str | None,
    unique_key: str,
    now: datetime | str | None = None,
) -> dict[str, Any]:
    """The stored document for ``item`` (already-checked plain fields, see :func:`check_fields`).

    The item's own ``url`` field, when it has one, is kept (typically the final URL after
    redirects); otherwise ``url`` is the task's URL. The other bookkeeping fields
    (:data:`RESERVED_FIELDS`) are set here; an item carrying one of them with a different value
    is rejected rather than silently overwritten. ``unique_key`` stays in the document when the
    item has it, as one of its fields.
    """
    stamp = now if isinstance(now, str) else utc_timestamp(now)
    meta: dict[str, Any] = {
        "_id": f"{site_id}:{unique_key}",
        "site_id": site_id,
        "seed_id": seed_id,
        "task_id": task_id,
        "updated_at": stamp,
        "first_seen_at": stamp,
    }
    for name, value in meta.items():
        if name in item and item[name] != value:
            raise DocumentError(
                name, f"is set by the store stage; rename this item field (got {item[name]!r})"
            )
    doc: dict[str, Any] = {"_id": meta["_id"]}
    doc.update(item)
    doc.setdefault("url", url)
    doc.update(meta)
    return doc


def last_wins(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One document per ``_id``: the last one, carrying the first one's ``first_seen_at``.

    Back ends may apply one batch's writes in any order (MongoDB's unordered bulk writes do),
    so duplicates are folded before writing instead of relying on write order.
    """
    folded: dict[str, dict[str, Any]] = {}
    for doc in docs:
        earlier = folded.pop(doc["_id"], None)
        if earlier is not None and earlier.get("first_seen_at") is not None:
            doc = {**doc, "first_seen_at": earlier["first_seen_at"]}
        folded[doc["_id"]] = doc  # re-inserted so the order is that of the last occurrences
    return list(folded.values())

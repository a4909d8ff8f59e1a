"""``METEORSEED_STORE_RETENTION``: documents not updated for that long are deleted.

MongoDB does it by itself (a TTL index, :mod:`.mongo`). On SQL stores it is a periodic delete
in the store thread, after a batch is committed, at most every tenth of the retention (and at
least every :data:`MAX_INTERVAL`), served by the index on the namespace's ``updated_at``. A
failed purge is logged and tried again at the next turn; it never fails the batch it follows
(those documents are committed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from meteorseed_scrapy.store.base import Store
from meteorseed_scrapy.store.documents import utc_timestamp

logger = logging.getLogger(__name__)

MAX_INTERVAL = 300.0


class RetainingStore(Store):
    """``inner``, purging documents older than ``retention`` seconds as it writes."""

    def __init__(self, inner: Store, retention: float) -> None:
        self.inner = inner
        self.namespace = inner.namespace
        self.retention = retention
        self.interval = min(MAX_INTERVAL, retention / 10)
        self._next = 0.0  # monotonic time of the next purge: the first write purges
        self.purged = 0

    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        self.inner.upsert_many(docs)
        self._purge_if_due()

    def upsert_unconfirmed(self, docs: list[dict[str, Any]]) -> None:
        self.inner.upsert_unconfirmed(docs)
        self._purge_if_due()

    def confirm_written(self) -> None:
        self.inner.confirm_written()

    def _purge_if_due(self) -> None:
        if time.monotonic() >= self._next:
            self.purge()

    def purge(self) -> int:
        """Delete what is past the retention now; how many documents."""
        self._next = time.monotonic() + self.interval
        cutoff = utc_timestamp(datetime.now(timezone.utc) - timedelta(seconds=self.retention))
        try:
            deleted = self.inner.purge_older_than(cutoff)
        except Exception as exc:  # (tried again next turn; the batch itself is committed)
            logger.warning("Store retention: could not delete documents older than %s: %s",
                           cutoff, exc)
            return 0
        if deleted:
            logger.info("Store retention: deleted %d documents not updated since %s",
                        deleted, cutoff)
        self.purged += deleted
        return deleted

    def purge_older_than(self, cutoff: str) -> int:
        return self.inner.purge_older_than(cutoff)

    def stop_waiting(self) -> None:
        self.inner.stop_waiting()

    def upsert_anomalies(self, docs: list[dict[str, Any]]) -> None:
        self.inner.upsert_anomalies(docs)

    def get(self, doc_id: str) -> dict[str, Any] | None:
        return self.inner.get(doc_id)

    def count(self) -> int:
        return self.inner.count()

    def iter_docs(self) -> Iterator[dict[str, Any]]:
        return self.inner.iter_docs()

    def iter_anomalies(self) -> Iterator[dict[str, Any]]:
        return self.inner.iter_anomalies()

    @property
    def export_kind(self) -> str:  # type: ignore[override]
        return self.inner.export_kind

    def export_page(self, after: tuple[int, str] | None, limit: int, *,
                    site_id: str | None = None, seed_id: str | None = None
                    ) -> list[tuple[tuple[int, str], dict[str, Any]]]:
        return self.inner.export_page(after, limit, site_id=site_id, seed_id=seed_id)

    def close(self) -> None:
        self.inner.close()


def bind(store: Store, namespace: str, retention: float | None) -> Store:
    """``store`` reading and writing ``namespace``'s documents, purged past ``retention`` (s;
    0: never; None: not this store's business, as for readers and the anomaly writer, which
    must not undo the store stage's MongoDB TTL index)."""
    store.namespace = namespace  # (set first: a RetainingStore copies it)
    if retention is None or store.keep_for(retention) or retention <= 0:
        return store
    return RetainingStore(store, retention)


__all__ = ["MAX_INTERVAL", "RetainingStore", "bind"]

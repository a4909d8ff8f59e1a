"""Shortcuts tests use on the stores, kept out of the product."""

from __future__ import annotations

from meteorseed_scrapy.store.base import Store


def all_ids(store: Store) -> set[str]:
    """Every stored document's ``_id`` in the store's namespace."""
    return {doc["_id"] for doc in store.iter_docs()}

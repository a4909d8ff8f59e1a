"""Shortcuts tests use on the stores, kept out of the product."""

from __future__ import annotations

from collections import Counter

from meteorseed_scrapy.store.base import Store


def all_ids(store: Store) -> set[str]:
    """Every stored document's ``_id`` in the store's namespace."""
    return {doc["_id"] for doc in store.iter_docs()}


def count_by_site(store: Store) -> dict[str, int]:
    """How many documents each site has in the store's namespace."""
    return dict(sorted(Counter(doc["site_id"] for doc in store.iter_docs()).items()))

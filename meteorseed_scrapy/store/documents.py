"""An item as a stored document: its key (``unique_key``, else the task's canonical URL) and
its origin (the running task, else the item's own fields)."""

from __future__ import annotations

from typing import Any

from itemadapter import ItemAdapter

from meteorseed_scrapy.store.base import (
    DocumentError,
    build_document,
    canonical_json,
    check_fields,
    check_unique_key,
)
from meteorseed_scrapy.task.canonical import url_hash
from meteorseed_scrapy.task.context import Scrape


class UniqueKeyError(ValueError):
    """An item cannot be given a document key (not a DropItem: its task must not be acked)."""


def item_document(item: Any, scrape: Scrape | None,
                  default_site_id: str | None) -> tuple[dict[str, Any], str]:
    """The document to store for ``item`` and the canonical JSON of its fields (see
    :mod:`meteorseed_scrapy.pipelines` for where its key and origin come from)."""
    fields = check_fields(ItemAdapter(item).asdict())
    origin: dict[str, Any]  # site_id, url, seed_id, task_id of the document
    if scrape is not None:
        task = scrape.task
        origin = {"site_id": task.site_id, "url": task.url, "seed_id": task.seed_id,
                  "task_id": task.task_id}  # fmt: skip
    else:
        origin = {name: fields.get(name) for name in ("site_id", "url", "seed_id", "task_id")}
        origin["site_id"] = origin["site_id"] or default_site_id
        if not isinstance(origin["site_id"], str) or not origin["site_id"]:
            raise DocumentError("site_id", f"must be a non-empty string: {origin['site_id']!r}")
    keyless = "unique_key" not in fields
    if not keyless:
        unique_key = check_unique_key(fields["unique_key"])
    elif scrape is not None:
        if scrape.keyless_items:
            raise UniqueKeyError(
                f"task {scrape.task.task_id} ({scrape.task.url}) yielded more than one item"
                " without a 'unique_key' field; they would overwrite each other: give each"
                " item a distinct unique_key"
            )
        unique_key = url_hash(scrape.task.url)
    elif isinstance(origin["url"], str) and origin["url"]:
        unique_key = url_hash(origin["url"])
    else:
        raise UniqueKeyError(
            "item has neither a 'unique_key' nor a 'url' field, and no MeteorSeed task"
            " is running: give it a unique_key"
        )
    doc = build_document(fields, unique_key=unique_key, **origin)
    if keyless and scrape is not None:
        scrape.keyless_items += 1  # counted once the item is known to be storable
    return doc, canonical_json(fields)


__all__ = ["UniqueKeyError", "item_document"]

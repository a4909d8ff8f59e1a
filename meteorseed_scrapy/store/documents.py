"""An item as a stored document: its key (``unique_key``, else derived from the task's
canonical URL and the item's place among the task's keyless items) and its origin (the running
task, else the item's own fields)."""

from __future__ import annotations

import hashlib
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
from meteorseed_scrapy.task.context import Output, Scrape


def item_document(item: Any, scrape: Scrape | None, default_site_id: str | None,
                  output: Output | None = None) -> tuple[dict[str, Any], str]:
    """The document to store for ``item`` (``output``: the callback output it is, when
    known) and the canonical JSON of its fields (see :mod:`meteorseed_scrapy.pipelines` for
    where its key and origin come from)."""
    fields = check_fields(ItemAdapter(item).asdict())
    content = canonical_json(fields)
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
        position = output.keyless_position if output is not None and output.scrape is scrape \
            else None
        unique_key = keyless_key(scrape.task.url, scrape.keyless_items if position is None
                                 else position)
    elif isinstance(origin["url"], str) and origin["url"]:
        unique_key = url_hash(origin["url"])
    else:
        # No task and no url (an item from start()): its content is all there is to go by.
        unique_key = "content-" + hashlib.sha256(content.encode("utf-8")).hexdigest()
    doc = build_document(fields, unique_key=unique_key, **origin)
    if keyless and scrape is not None:
        scrape.keyless_items += 1  # counted once the item is known to be storable
    return doc, content


def keyless_key(task_url: str, position: int) -> str:
    """The ``unique_key`` of the keyless item at ``position`` among those a task's callback
    yielded: the SHA-256 of the task's canonical URL, then ``-<position>`` from the second
    on (so a page's one item keeps the key it always had)."""
    digest = url_hash(task_url)
    return digest if position == 0 else f"{digest}-{position}"


__all__ = ["item_document", "keyless_key"]

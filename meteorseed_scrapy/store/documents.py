"""The stored document: an item's own fields plus bookkeeping, under one key::

    {"_id": "<site_id>:<unique_key>", <item fields...>, "site_id": ..., "url": ...,
     "seed_id": ..., "task_id": ..., "updated_at": "<ISO-8601 UTC>", "first_seen_at": "<...>"}

Its key is the item's ``unique_key``, else derived from the task's canonical URL and the
item's place among the task's keyless items; its origin is the running task, else the item's
own fields. Every back end writes the documents built here (:mod:`.base`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from datetime import date, datetime, time, timezone
from typing import Any

from itemadapter import ItemAdapter
from scrapy.utils.serialize import ScrapyJSONEncoder

from meteorseed_scrapy.task.canonical import canonical_json, url_hash
from meteorseed_scrapy.task.context import Output, Scrape

#: Bookkeeping fields the store stage sets; an item may carry them only with the same value.
RESERVED_FIELDS = ("_id", "site_id", "seed_id", "task_id", "updated_at", "first_seen_at")
_MAX_UNIQUE_KEY = 1000


class DocumentError(ValueError):
    """An item cannot become a stored document; ``field`` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


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


#: Scrapy's own JSON conversions (those of its JSON feed exports): a ``Decimal`` becomes its
#: text, a set a list, a nested item a dict.
_SCRAPY_JSON = ScrapyJSONEncoder()


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
    if isinstance(value, (date, time)):  # (a datetime is a date)
        # ISO 8601, as Scrapy 2.19's feeds write it, whatever the Scrapy: an older one's
        # encoder (2.14's) drops the microseconds and the time zone.
        return value.isoformat()
    try:  # what stock Scrapy's feeds write for it (a price-parser amount, a set)
        converted = _SCRAPY_JSON.default(value)
    except TypeError:
        raise DocumentError(path, f"is not JSON-serialisable ({type(value).__name__})") from None
    return _plain(path, converted)


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


__all__ = ["RESERVED_FIELDS", "DocumentError", "build_document", "check_fields",
           "check_unique_key", "item_document", "keyless_key", "last_wins", "utc_timestamp"]

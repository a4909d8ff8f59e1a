"""The feed of committed items: ``<ns>:items``, a Redis stream other programs read with their
own consumer groups (docs/items-feed.md).

``METEORSEED_ITEMS_FEED`` (``off``, ``ids``, ``documents``): once a document is committed, the
store stage keeps one entry for it on its task's scrape; the entries are sent in the task's
completion pipeline, *before* its completion record and its XACK. At least once:

- Redis unreachable: the pipeline fails as a whole; its entries go back to the queue with the
  records and acks and are sent again with them (the task is not acked meanwhile).
- An XADD refused while the XACK after it runs (Redis out of memory under ``noeviction``,
  ``<ns>:items`` made something else than a stream): the pipeline's error puts the entries
  back too, and they are sent again until Redis takes them (the ack itself is not repeated).
- A task redelivered (a worker died before its ack) commits its items again: their entries
  come again. A consumer sees an ``_id`` more than once; never none.

Each entry: ``_id``, ``site_id``, ``seed_id`` and ``task_id`` ("" when null), ``committed_at``
(ISO-8601 UTC, when the store reported the commit) and, in ``documents`` mode, ``doc``: the
document as committed, JSON. The stream is capped with ``MAXLEN ~`` and, with
``METEORSEED_ITEMS_FEED_MAX_AGE``, trimmed of entries older than that (``XTRIM MINID ~``, once
per pipeline): a consumer away for longer than the bound misses entries, and catches up with
``meteorseed export`` (docs/items-feed.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from meteorseed_scrapy.settings import FeedConfig

#: The entry's fields besides ``doc``, in order.
FIELDS = ("_id", "site_id", "seed_id", "task_id", "committed_at")


def feed_entry(doc: Mapping[str, Any], mode: str, committed_at: str) -> dict[str, str]:
    """The feed entry of committed ``doc`` (``mode``: ``ids`` or ``documents``)."""
    entry = {name: "" if doc.get(name) is None else str(doc.get(name))
             for name in FIELDS[:-1]}
    entry["committed_at"] = committed_at
    if mode == "documents":
        entry["doc"] = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return entry


def queue_entries(pipe: Any, key: str, entries: Sequence[Mapping[str, str]],
                  config: FeedConfig) -> int:
    """Queue the XADDs of ``entries`` (and the age trim) on redis-py pipeline ``pipe``; how many
    commands were queued."""
    for entry in entries:
        pipe.xadd(key, dict(entry), maxlen=config.maxlen, approximate=True)
    queued = len(entries)
    if entries and config.max_age > 0:
        oldest_ms = int((time.time() - config.max_age) * 1000)
        pipe.xtrim(key, minid=f"{oldest_ms}-0", approximate=True)
        queued += 1
    return queued


__all__ = ["FIELDS", "feed_entry", "queue_entries"]

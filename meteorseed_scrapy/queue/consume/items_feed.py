"""The feed of committed items: ``<ns>:items``, a Redis stream other programs read with their
own consumer groups (docs/items-feed.md).

``METEORSEED_ITEMS_FEED`` (``off``, ``ids``, ``documents``): once a document is committed, the
store stage keeps one entry for it on its task's scrape; the entries are appended by the script
that acks the task (``lua/ack.lua``, :mod:`.acks`), *before* its completion record and its
XACK, in one script call. At least once:

- Redis unreachable: nothing is written; the entries stay queued with their acks and are sent
  again with them (the task is not acked meanwhile).
- An XADD refused (Redis out of memory under ``noeviction``, ``<ns>:items`` made something else
  than a stream): the script stops there, before it writes the record or acks anything; the
  worker sends it all again until Redis takes it. Should the worker die first, the task is
  still pending and without a record: it is delivered again, refetched, and fed then.
- A task redelivered (a worker died before its ack) commits its items again: their entries
  come again. A consumer sees an ``_id`` more than once; never none.

Each entry: ``_id``, ``site_id``, ``seed_id`` and ``task_id`` ("" when null), ``committed_at``
(ISO-8601 UTC, when the store reported the commit) and, in ``documents`` mode, ``doc``: the
document as committed, JSON. The stream is capped with ``MAXLEN ~`` and, with
``METEORSEED_ITEMS_FEED_MAX_AGE``, trimmed of entries older than that by Redis's clock, which
made their ids (``XTRIM MINID ~``, once per script call): a consumer away for longer than the
bound misses entries, and catches up with ``meteorseed export`` (docs/items-feed.md). On a
Redis Cluster each shard has its own feed, ``<ns>:{s<k>}:items``, in its task streams' slot
(the script may touch no other).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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


__all__ = ["FIELDS", "feed_entry"]

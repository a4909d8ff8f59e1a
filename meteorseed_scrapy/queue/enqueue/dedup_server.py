"""The one server setting the dedup layer's memory budget depends on, checked at start.

Exact-layer buckets hold up to ~128 entries (mean 40, see ``DD_LOAD`` in dedup_lib.lua) and
rely on Redis keeping such small hashes in its compact listpack (7.x) / ziplist (6.2)
encoding. The defaults (128 entries, 64-byte values) do; a server configured lower still
dedups correctly, but each bucket becomes a real hash table costing ~4x the memory.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.plumbing.replies import text_of

logger = logging.getLogger(__name__)

#: Entries a bucket must be able to hold compactly (DD_LOAD 40, unsplit buckets ~2x, + tail).
NEEDED_ENTRIES = 128
#: Bytes of the longest field or value (6-byte fingerprint prefix, slot number).
NEEDED_VALUE = 8


async def check_server_config(redis: Any) -> list[str]:
    """Warnings when Redis would not keep dedup buckets compact (empty when all is well).

    ``hash-max-ziplist-*`` is the 6.2 name and an alias of ``hash-max-listpack-*`` on 7.x, so
    one query works on both.
    """
    try:
        got = await redis.config_get("hash-max-ziplist-*")
    except ResponseError as exc:  # CONFIG disabled on managed Redis: cannot tell
        return [f"cannot read hash-max-ziplist-entries ({exc}); dedup memory assumes >= "
                f"{NEEDED_ENTRIES}"]
    values = {text_of(k, "strict"): text_of(v, "strict") for k, v in got.items()}
    warnings = []
    entries = int(values.get("hash-max-ziplist-entries", NEEDED_ENTRIES))
    value = int(values.get("hash-max-ziplist-value", NEEDED_VALUE))
    if entries < NEEDED_ENTRIES or value < NEEDED_VALUE:
        warnings.append(
            f"Redis hash-max-listpack-entries/value is {entries}/{value} (defaults 128/64): "
            f"URL dedup stays correct but uses several times its memory budget; set at least "
            f"{NEEDED_ENTRIES}/{NEEDED_VALUE}"
        )
    return warnings

"""Two-layer, per-site URL dedup in Redis: a Bloom filter in front, an exact layer behind it.

The Lua side is ``lua/dedup_lib.lua`` (used by ``enqueue.lua`` and ``dead.lua``); the key layout
is in :mod:`meteorseed_scrapy.keys`; rates and memory are justified in ``docs/dedup.md``.
"""

from __future__ import annotations

from meteorseed_scrapy.dedup.fingerprint import (
    RECRAWL_META_KEY,
    fingerprint,
    fingerprint_bytes,
    recrawl_window,
)
from meteorseed_scrapy.dedup.server import check_server_config

__all__ = [
    "RECRAWL_META_KEY",
    "check_server_config",
    "fingerprint",
    "fingerprint_bytes",
    "recrawl_window",
]

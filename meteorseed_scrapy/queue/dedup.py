"""What identifies a request for dedup, and which re-crawl window applies to it."""

from __future__ import annotations

import hashlib
from typing import Any

from meteorseed_scrapy.task.canonical import canonical_url
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError

#: Exec task ``meta`` key holding the re-crawl window in seconds (a seed's ``recrawl_after``).
RECRAWL_META_KEY = "recrawl_after"
#: Longest accepted window: ten years (the Lua side keys generations by ``now // window``).
MAX_RECRAWL_AFTER = 10 * 365 * 86400


def fingerprint_bytes(task: ExecTask, canonical: str | None = None) -> bytes:
    """16 bytes of SHA-256 identifying ``task`` for dedup (the layout is in dedup_lib.lua).

    A plain GET is identified by its canonical URL alone. Any other method, or a GET that carries
    a body, also hashes the method and the body: a POST search with two different bodies is two
    different requests. ``canonical`` skips re-canonicalising when the caller already did.
    Raises ``ValueError`` when the URL cannot be canonicalised.
    """
    method = task.method.upper()
    url = canonical if canonical is not None else canonical_url(task.url)
    data = url if method == "GET" and not task.body else f"{method}\0{url}\0{task.body}"
    return hashlib.sha256(data.encode("utf-8")).digest()[:16]


def fingerprint(task: ExecTask) -> str:
    """:func:`fingerprint_bytes` as 32 hex digits (the form ``dead.lua`` takes)."""
    return fingerprint_bytes(task).hex()


def check_recrawl_after(value: Any, name: str = RECRAWL_META_KEY) -> int:
    """``value`` as a window in whole seconds (0 = never re-crawl), else :class:`TaskError`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TaskError(name, f"must be a whole number of seconds, got {value!r}"[:300])
    if not 0 <= value <= MAX_RECRAWL_AFTER:
        raise TaskError(name, f"must be between 0 and {MAX_RECRAWL_AFTER} seconds")
    return value


def recrawl_window(task: ExecTask) -> str:
    """The window argument of ``enqueue.lua`` for ``task``: its ``meta["recrawl_after"]`` as a
    string, or ``""`` (the site's stored window; child requests carry none)."""
    value = task.meta.get(RECRAWL_META_KEY)
    if value is None:
        return ""
    return str(check_recrawl_after(value, f"meta.{RECRAWL_META_KEY}"))

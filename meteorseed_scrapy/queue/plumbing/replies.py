"""A Redis reply as text (or as bytes), whether the client decodes responses or not.

The clients are made with and without ``decode_responses`` (:mod:`.connection`), so a reader
that shows or compares a reply as text gets bytes or str alike; this is the one place that
turns either into ``str`` or into ``bytes``. (A reply asked for as bytes,
:func:`~meteorseed_scrapy.queue.plumbing.scripts.call_as_bytes`, is bytes already.)
"""

from __future__ import annotations

from typing import Any


def text_of(value: Any, errors: str = "replace") -> str:
    """``value`` as text: bytes decoded as UTF-8 (a bad byte handled per ``errors``, a
    :meth:`bytes.decode` error handler), anything else through ``str`` (None gives "None")."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)


def bytes_of(value: bytes | str) -> bytes:
    """``value`` as bytes: str encoded back as it was decoded (UTF-8; a byte that was not
    UTF-8 comes back as itself where the decoder kept it as a surrogate)."""
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


__all__ = ["bytes_of", "text_of"]

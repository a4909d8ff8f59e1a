"""A Redis reply as text, whether the client decodes responses or not.

The clients are made with and without ``decode_responses`` (:mod:`.connection`), so a reader
that shows or compares a reply as text gets bytes or str alike; this is the one place that
turns either into ``str``.
"""

from __future__ import annotations

from typing import Any


def text_of(value: Any, errors: str = "replace") -> str:
    """``value`` as text: bytes decoded as UTF-8 (a bad byte handled per ``errors``, a
    :meth:`bytes.decode` error handler), anything else through ``str`` (None gives "None")."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)


__all__ = ["text_of"]

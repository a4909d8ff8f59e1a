"""A Redis reply as text (or as bytes), whether the client decodes responses or not.

The clients are made with and without ``decode_responses`` (:mod:`.connection`), so a reader
that shows or compares a reply as text gets bytes or str alike; this is the one place that
turns either into ``str`` or into ``bytes``. (A reply asked for as bytes,
:func:`~meteorseed_scrapy.queue.plumbing.scripts.call_as_bytes`, is bytes already.) And the
one reading of a JSON record kept in Redis (who held a site, a seed's last control, a task's
done record), which anyone with access to the namespace may have written.
"""

from __future__ import annotations

from typing import Any

from meteorseed_scrapy.task.json_depth import loads_bounded

#: Characters of a damaged record shown in its place.
DAMAGED_SHOWN = 200


def text_of(value: Any, errors: str = "replace") -> str:
    """``value`` as text: bytes decoded as UTF-8 (a bad byte handled per ``errors``, a
    :meth:`bytes.decode` error handler), anything else through ``str`` (None gives "None")."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)


def bytes_of(value: bytes | str) -> bytes:
    """``value`` as bytes: str encoded back as it was decoded (UTF-8; a byte that was not
    UTF-8 comes back as itself where the decoder kept it as a surrogate)."""
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


def record_of(reply: Any) -> dict[str, Any]:
    """The JSON object stored as ``reply``; anything else (not JSON, too deep, an array, a
    string, a number, null) reads as ``{"damaged": its first 200 characters}``, so that the
    lists and pages showing records show that one as damaged rather than fail."""
    text = text_of(reply)
    try:
        record = loads_bounded("record", text)
    except ValueError:
        record = None
    return record if isinstance(record, dict) else {"damaged": text[:DAMAGED_SHOWN]}


__all__ = ["DAMAGED_SHOWN", "bytes_of", "record_of", "text_of"]

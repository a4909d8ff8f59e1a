"""The cursor of ``meteorseed export``: where in a store's change order an export stopped.

Every back end orders a namespace's documents by a *change position*, ``(sequence, _id)``,
where the sequence grows with each committed write of a document (:meth:`Store.export_page`):
an upsert that changes a document after an export moves it past the cursor, so it comes out
again; a document left alone keeps its position and does not. The cursor is that position and
the back end's kind, as opaque text (URL-safe base64 of a small JSON array): a cursor of
another kind of store, or anything not made here, is refused rather than read wrongly.
"""

from __future__ import annotations

import base64
import binascii
import json

from meteorseed_scrapy.task.json_depth import loads_bounded

#: The kinds of position: a back end's sequence means nothing to another.
KINDS = ("sqlite", "postgresql", "mongodb")
_MAX_SEQUENCE = 2**64 - 1  # (PostgreSQL's xid8 is unsigned 64-bit)
_MAX_CURSOR = 4096

Position = tuple[int, str]


def encode_cursor(kind: str, position: Position) -> str:
    sequence, doc_id = position
    raw = json.dumps([kind, sequence, doc_id], ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")


def decode_cursor(text: str, kind: str) -> Position:
    """The position in ``text``, a cursor of a ``kind`` store; :class:`ValueError` saying why
    it is not one."""
    if not text or len(text) > _MAX_CURSOR or not text.isascii():
        raise ValueError("not a cursor printed by meteorseed export")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = loads_bounded("cursor", raw.decode("utf-8"))
    except (binascii.Error, ValueError):
        raise ValueError("not a cursor printed by meteorseed export") from None
    if (not isinstance(value, list) or len(value) != 3 or value[0] not in KINDS
            or type(value[1]) is not int or not 0 <= value[1] <= _MAX_SEQUENCE
            or not isinstance(value[2], str)):
        raise ValueError("not a cursor printed by meteorseed export")
    if value[0] != kind:
        raise ValueError(f"a cursor of a {value[0]} store, this store is {kind}")
    return value[1], value[2]


def field_conditions(condition: str, site_id: str | None, seed_id: str | None
                     ) -> tuple[str, list[str]]:
    """SQL ``AND`` conditions of an export's filters (``condition``: one field's test, the
    field's name in ``{}``) and their parameters."""
    wanted = [(name, value) for name, value in (("site_id", site_id), ("seed_id", seed_id))
              if value is not None]
    return "".join(f" AND {condition.format(name)}" for name, _ in wanted), [
        value for _, value in wanted]


__all__ = ["KINDS", "Position", "decode_cursor", "encode_cursor", "field_conditions"]

"""A delivery from a task stream, and small helpers of the consumer's bookkeeping."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError

#: A message in a task stream: ``(stream key, message id)``. Ids are unique per stream only.
Ref = tuple[str, str]


#: A stream entry's fields exactly as stored: ``(name, value)`` pairs, in order, repeats kept.
Pairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Delivery:
    """One stream entry as delivered to this consumer; ``task`` is None when it is malformed.

    ``fields`` are the entry's fields as text; ``pairs`` (from :meth:`decode`) are all of them as
    stored, which the dead letter of a malformed entry keeps. In both, a byte that is not UTF-8
    is held as a lone surrogate U+DC80..U+DCFF (Python's ``surrogateescape``: lossless, and
    never a valid task, which the decoding refused).
    """

    stream: str
    msg_id: str
    fields: Mapping[str, str]
    deliveries: int
    task: ExecTask | None = None
    error: str = ""
    pairs: Pairs = ()

    @property
    def ref(self) -> Ref:
        return (self.stream, self.msg_id)

    @property
    def raw_fields(self) -> Pairs:
        """Every field as stored (:attr:`pairs`, or ``fields`` for a delivery built by hand)."""
        return self.pairs or tuple(self.fields.items())

    @classmethod
    def decode(cls, stream: str, msg_id: str,
               fields: Mapping[Any, Any] | Sequence[tuple[Any, Any]] | None,
               deliveries: int) -> Delivery:
        """Never raises, whatever the fields hold (bytes from a client that does not decode
        replies, or text): a message that is not a valid task comes back with ``task`` None
        and the reason in ``error``, to be dead-lettered alone."""
        items = list((fields or {}).items() if isinstance(fields, Mapping) else fields or ())
        pairs = tuple((_escaped(k), _escaped(v)) for k, v in items)
        text = dict(pairs)
        try:
            task = ExecTask.from_message(items)
        except TaskError as exc:
            return cls(stream, msg_id, text, deliveries, None, f"malformed message: {exc}", pairs)
        except Exception as exc:  # a trust boundary: one message never stops the others
            return cls(stream, msg_id, text, deliveries, None,
                       f"malformed message: cannot be decoded ({type(exc).__name__}: {exc})",
                       pairs)
        return cls(stream, msg_id, text, deliveries, task, "", pairs)


    @property
    def dead_payload(self) -> str:
        """The ``t`` of its dead letter: the task JSON as it came, or for a malformed message
        every field as stored, whole and in order, as one JSON object (a repeated name is
        repeated; a byte that is not UTF-8 is written ``\\udcXX``, which ``surrogateescape``
        turns back into that byte)."""
        if self.task is not None:
            return self.fields.get("t") or self.task.to_message()["t"]
        return "{" + ",".join(f"{_json_text(k)}:{_json_text(v)}" for k, v in self.raw_fields) + "}"


def _json_text(value: str) -> str:
    out = json.dumps(value, ensure_ascii=False)
    if not out.isascii():
        try:
            out.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (a byte that was not UTF-8): escape all
            out = json.dumps(value)
    return out


def _escaped(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else str(value)


def trim_shares(shares: list[int], total: int) -> list[int]:
    """``shares`` cut down (last lanes first) so that they sum to at most ``total``."""
    out = list(shares)
    excess = sum(out) - max(0, total)
    for i in range(len(out) - 1, -1, -1):
        if excess <= 0:
            break
        cut = min(out[i], excess)
        out[i] -= cut
        excess -= cut
    return out

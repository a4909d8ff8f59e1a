"""A delivery from a task stream, and small helpers of the consumer's bookkeeping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError

#: A message in a task stream: ``(stream key, message id)``. Ids are unique per stream only.
Ref = tuple[str, str]


@dataclass(frozen=True)
class Delivery:
    """One stream entry as delivered to this consumer; ``task`` is None when it is malformed."""

    stream: str
    msg_id: str
    fields: Mapping[str, str]
    deliveries: int
    task: ExecTask | None = None
    error: str = ""

    @property
    def ref(self) -> Ref:
        return (self.stream, self.msg_id)

    @classmethod
    def decode(cls, stream: str, msg_id: str, fields: Mapping[str, str] | None,
               deliveries: int) -> Delivery:
        fields = fields or {}
        try:
            return cls(stream, msg_id, fields, deliveries, ExecTask.from_message(fields))
        except TaskError as exc:
            return cls(stream, msg_id, fields, deliveries, None, f"malformed message: {exc}")


def by_stream(refs: Sequence[Ref]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for stream, msg_id in refs:
        out.setdefault(stream, []).append(msg_id)
    return out


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

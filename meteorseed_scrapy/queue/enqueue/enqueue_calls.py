"""``lua/enqueue.lua``'s calls: a batch of encoded tasks split into script calls, their
arguments packed, and the calls' replies read back as one :class:`AddResult`.

Pure values and packing, no I/O: :class:`~meteorseed_scrapy.queue.enqueue.writer.TaskWriter` sends
the
calls (one round trip, or behind the batch before, see
:mod:`~meteorseed_scrapy.queue.enqueue.batch_pipeline`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.task.exec_task import MESSAGE_VERSION

__all__ = ["CHUNK_SIZE", "AddResult", "Encoded", "EnqueueCalls", "owners_arg", "pack_tasks",
           "script_args"]

#: Tasks per script call. A call blocks Redis while it runs; 500 dedup checks + XADDs take a
#: few milliseconds, so workers reading the stream never wait long behind a big seed file.
CHUNK_SIZE = 500

# enqueue.lua writes the "v" field itself (the task JSON is its only payload); a new message
# version in task/exec_task.py must come with a script update: fail loudly at import, not in
# Redis.
_SCRIPT_MESSAGE_VERSION = "1"
if MESSAGE_VERSION != _SCRIPT_MESSAGE_VERSION:  # pragma: no cover - guards a future edit
    raise RuntimeError(
        f"lua/enqueue.lua writes message version {_SCRIPT_MESSAGE_VERSION}, "
        f"task/exec_task.py encodes version {MESSAGE_VERSION}: update the script"
    )


class Encoded(NamedTuple):
    """One task as ``enqueue.lua`` takes it (see
    :meth:`~meteorseed_scrapy.queue.enqueue.writer.TaskWriter.encoder`)."""

    root: str | None  # the site's dedup root, None = no dedup
    fingerprint: bytes
    window: str  # re-crawl window argument ("" = the site's stored one)
    payload: str  # the task JSON
    stream: str  # the task stream of its lane and band
    owner: str = ""  # whom it counts for: ``seed_id<TAB>site_id`` (queue/fleet/crawl_progress.py)


@dataclass(frozen=True)
class AddResult:
    """What one :meth:`~meteorseed_scrapy.queue.enqueue.writer.TaskWriter.add` call did;
    ``fresh[i]``
    says whether its i-th task was enqueued (False: a duplicate), in the order the tasks were
    given."""

    enqueued: int = 0
    duplicates: int = 0
    fresh: tuple[bool, ...] = field(default=(), compare=False)

    def __add__(self, other: AddResult) -> AddResult:
        return AddResult(self.enqueued + other.enqueued, self.duplicates + other.duplicates,
                         self.fresh + other.fresh)


_NO_ROOT = bytes(8)  # root index 0 (no dedup) and an unused entry
_FIRST_ROOT = (1).to_bytes(2, "big")
_ROOT, _FINGERPRINT, _WINDOW, _PAYLOAD, _STREAM, _OWNER = (itemgetter(i) for i in range(6))
_ENTRY = itemgetter(slice(0, 6))  # a fingerprint's dedup entry (see enqueue.lua)


def _one_root_one_window(chunk: Sequence[Encoded]) -> bool:
    """Every task of ``chunk`` deduplicated under one root with one window (a seed's URLs)."""
    roots = set(map(_ROOT, chunk))
    return len(roots) == 1 and None not in roots and len(set(map(_WINDOW, chunk))) == 1


def _one_root_meta(chunk: Sequence[Encoded]) -> bytes:
    """enqueue.lua's 8-byte records of tasks that all have root 1: the 16-byte fingerprints
    joined once and their first 6 bytes laid out by strided slices (C loops, where a slice
    and a join per task took twice as long on the path between two script calls)."""
    count = len(chunk)
    fps = b"".join(map(_FINGERPRINT, chunk))
    if len(fps) != 16 * count:  # (fingerprints are always 16 bytes: a guard)
        return _FIRST_ROOT + _FIRST_ROOT.join(map(_ENTRY, map(_FINGERPRINT, chunk)))
    records = bytearray(8 * count)
    records[1::8] = _FIRST_ROOT[1:] * count
    for k in range(6):
        records[2 + k::8] = fps[k::16]
    return bytes(records)


def _without_repeats(chunk: Sequence[Encoded]) -> tuple[Sequence[Encoded], list[int] | None]:
    """``chunk`` less each task whose fingerprint an earlier task of it has, and the positions
    of the tasks kept (None: all). In one call with one root and one window (one generation),
    enqueue.lua flags such a repeat a duplicate whatever the state of Redis: it need not be
    sent, parsed and looked up there (seed lists repeat URLs; Redis is the busier side)."""
    fingerprints = [*map(_FINGERPRINT, chunk)]
    if len(set(fingerprints)) == len(fingerprints):
        return chunk, None
    if not _one_root_one_window(chunk):
        return chunk, None
    seen: set[bytes] = set()
    kept: list[int] = []
    for position, fingerprint in enumerate(fingerprints):
        if fingerprint not in seen:
            seen.add(fingerprint)
            kept.append(position)
    return [chunk[i] for i in kept], kept


def pack_tasks(records: Iterable[tuple[int, bytes, str, str]]) -> list[str | bytes]:
    """``enqueue.lua``'s arguments after ``now`` from ``(root index, fingerprint, window, task
    JSON)`` per task (root index 0: no dedup; window "": the site's); see the script.

    The JSONs travel newline-terminated in one string and the roots and dedup entries as fixed
    8-byte records: two C-level joins per batch, no per-task length prefixes.
    """
    payloads: list[str] = []
    meta: list[bytes] = []
    windows: list[str] = []
    index_bytes: dict[int, bytes] = {}
    for number, (root, fp, window, payload) in enumerate(records, 1):
        payloads.append(payload)
        if root:
            head = index_bytes.get(root)
            if head is None:
                head = index_bytes[root] = root.to_bytes(2, "big")
            meta.append(head + fp[:6])
            if window:
                windows += (str(number), window)
        else:
            meta.append(_NO_ROOT)
    payloads.append("")
    jsons = "\n".join(payloads)
    if jsons.count("\n") != len(meta):  # (JSON escapes newlines: a guard, not a path)
        raise ValueError("a task JSON holds a raw newline")
    return [jsons, b"".join(meta), *windows]


def owners_arg(chunk: Sequence[Encoded]) -> str:
    """enqueue.lua's seed lines: one line when every task of ``chunk`` counts for the same
    seed and site (a seed's URLs), else one per task."""
    owners = [*map(_OWNER, chunk)]
    if len(set(owners)) == 1:
        return owners[0]
    return "\n".join(owners) + "\n"


def holds_arg(holds: Mapping[str, bool]) -> str:
    """enqueue.lua's hold lines: seed_id -> held (more of its URLs come after the call)."""
    return "".join(f"{seed}\t{int(held)}\n" for seed, held in holds.items())


def script_args(stream: str, chunk: Sequence[Encoded], now: str, events: str = "",
                holds: Mapping[str, bool] | None = None, retention: int = 0
                ) -> tuple[list[str], list[str | bytes]]:
    """The keys and arguments of one enqueue.lua call of ``chunk`` (all of ``stream``);
    ``now``: the clock argument ("" = the server's TIME); ``events``: the crawl events stream
    ("" = none; :func:`~meteorseed_scrapy.queue.fleet.crawl_progress.events_key`); ``holds``: the
    seeds the expansion holds (True) or lets go (False) with it; ``retention``: seconds a seed
    it finishes keeps its counters."""
    keys, args = _script_args(stream, chunk, now)
    return keys, [*args[:3], events, owners_arg(chunk), holds_arg(holds or {}), str(retention),
                  *args[3:]]


def _script_args(stream: str, chunk: Sequence[Encoded], now: str
                 ) -> tuple[list[str], list[str | bytes]]:
    if _one_root_one_window(chunk):
        # One site and one window (a seed's URLs): packed by C-level joins alone, the
        # window sent with the first task only.
        window = chunk[0].window
        payloads = [*map(_PAYLOAD, chunk)]
        # (JSON escapes newlines: a guard; `in` is a memchr, five times a count's speed)
        if "\n" in "".join(payloads):
            raise ValueError("a task JSON holds a raw newline")
        payloads.append("")
        jsons = "\n".join(payloads)
        return ([stream, str(chunk[0].root)],  # (the one root: not None, see above)
                [now, jsons, _one_root_meta(chunk), *(("1", window) if window else ())])
    positions: dict[str, int] = {}  # dedup root -> 1-based position after the stream key
    # A window equal to the one already sent for that root in this call goes as "": the
    # script then reuses the window it holds for the root (the same value) instead of
    # reading it from Redis again for every task.
    sent: dict[int, str] = {}
    records: list[tuple[int, bytes, str, str]] = []
    for root, fp, window, payload, *_ in chunk:
        if root is None:
            records.append((0, b"", "", payload))
            continue
        index = positions.setdefault(root, len(positions) + 1)
        if window:
            if sent.get(index) == window:
                window = ""
            else:
                sent[index] = window
        records.append((index, fp, window, payload))
    return [stream, *positions], [now, *pack_tasks(records)]


class EnqueueCalls:
    """The script calls of one batch of encoded tasks: :data:`CHUNK_SIZE` tasks a call, each
    call of one stream (a stream's dedup roots are in its shard's slot, so each call touches
    one slot) and less the repeats it need not send; :meth:`result` reads their replies."""

    def __init__(self, encoded: Sequence[Encoded]) -> None:
        groups: list[Sequence[Encoded]]  # the tasks of each stream, in order
        self._count = len(encoded)
        self._order: list[int] | None = None  # their positions in ``encoded`` (None: the same)
        if len(set(map(_STREAM, encoded))) == 1:  # one lane and band: a seed's URLs
            groups = [encoded]
        else:
            streams: dict[str, list[int]] = {}
            for position, item in enumerate(encoded):
                streams.setdefault(item.stream, []).append(position)
            groups = [[encoded[p] for p in positions] for positions in streams.values()]
            self._order = [p for positions in streams.values() for p in positions]
        self.chunks = [group[i : i + CHUNK_SIZE] for group in groups
                       for i in range(0, len(group), CHUNK_SIZE)]
        self._sending = [_without_repeats(chunk) for chunk in self.chunks]
        #: The tasks each call sends (a chunk less its repeats), one call a chunk.
        self.sent = [sent for sent, _ in self._sending]

    def holds(self, holds: Mapping[str, bool] | None) -> list[dict[str, bool]]:
        """Per call, the ``holds`` of the seeds it has tasks of; a seed let go by the batch
        is still held by each call before the last that has its tasks (they run in order)."""
        if not holds:
            return [{} for _ in self.sent]
        seeds = [{owner.partition("\t")[0] for owner in map(_OWNER, sent)} & holds.keys()
                 for sent in self.sent]
        out: list[dict[str, bool]] = []
        later: set[str] = set()
        for present in reversed(seeds):
            out.append({seed: holds[seed] or seed in later for seed in sorted(present)})
            later |= present
        return out[::-1]

    def streams(self) -> list[str]:
        """The streams the calls write to, each once, in order."""
        return list(dict.fromkeys(chunk[0].stream for chunk in self.chunks))

    def result(self, replies: Sequence[Any]) -> AddResult:
        """The calls' replies (one per call, in order) as the batch's :class:`AddResult`."""
        enqueued = duplicates = 0
        texts: list[str] = []
        for chunk, (sent, kept), (added, dups, flags) in zip(self.chunks, self._sending,
                                                              replies, strict=True):
            enqueued += int(added)
            duplicates += int(dups)
            text = text_of(flags, "strict")
            if len(text) != len(sent):
                raise ValueError(f"enqueue.lua answered {len(text)} flags for {len(sent)} tasks")
            if kept is not None:  # the repeats left out: duplicates, as the script would say
                every = ["0"] * len(chunk)
                for position, mark in zip(kept, text, strict=True):
                    every[position] = mark
                duplicates += len(chunk) - len(sent)
                text = "".join(every)
            texts.append(text)
        flagged = map("1".__eq__, "".join(texts))
        if self._order is None:
            fresh = tuple(flagged)
        else:
            by_position = [False] * self._count
            for position, flag in zip(self._order, flagged, strict=True):
                by_position[position] = flag
            fresh = tuple(by_position)
        return AddResult(enqueued, duplicates, fresh)

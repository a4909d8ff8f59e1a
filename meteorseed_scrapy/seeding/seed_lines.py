"""Seed input: JSON Lines read with bounded memory, each line parsed into a validated seed."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import IO

from meteorseed_scrapy.seeding.expand_types import ExpandSummary, Rejection
from meteorseed_scrapy.seeding.seed_urls import check_payload
from meteorseed_scrapy.task.json_depth import loads_bounded
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

#: Longest accepted seed line, in UTF-8 bytes, line ending excluded.
MAX_LINE_BYTES = 2 * 1024 * 1024

# json.loads turns "\ud800" escapes into lone surrogates, which UTF-8 (and so Redis keys and
# messages) cannot carry. Only lines holding such an escape pay for the full check.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class SeedLineError(ValueError):
    """A seed line that cannot be used at all; nothing of it is enqueued."""

    def __init__(self, lineno: int, reason: str) -> None:
        super().__init__(f"line {lineno}: {reason}")
        self.lineno = lineno
        self.reason = reason


def parse_seed_line(line: str | bytes, lineno: int) -> SeedTask:
    """Parse and validate one JSON Lines seed; raises :class:`SeedLineError` with the reason.

    ``bytes`` are checked against :data:`MAX_LINE_BYTES` before decoding (so a reader can hand
    over a cut-off prefix of an over-long line) and must be UTF-8.
    """
    if isinstance(line, bytes):
        raw = line
        if len(raw) > MAX_LINE_BYTES:
            raise SeedLineError(lineno, _too_long())
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SeedLineError(lineno, f"is not valid UTF-8 (byte {exc.start})") from None
    elif len(line) > MAX_LINE_BYTES // 4 and len(line.encode("utf-8", "replace")) > MAX_LINE_BYTES:
        # (a str of at most MAX/4 characters cannot exceed MAX bytes: skip the encode)
        raise SeedLineError(lineno, _too_long())
    try:
        data = loads_bounded("", line)
    except TaskError as exc:  # nested too deeply (the same on every Python), or a key twice
        raise SeedLineError(lineno, str(exc)) from None
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        column = f" at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise SeedLineError(lineno, f"is not valid JSON ({reason}{column})") from None
    if _SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise SeedLineError(
                lineno, "holds an unpaired surrogate escape (\\ud800-\\udfff)"
            ) from None
    try:
        seed = SeedTask.from_dict(data)
        check_payload(seed)
    except TaskError as exc:
        raise SeedLineError(lineno, str(exc)) from None
    except TypeError as exc:  # e.g. a list as task_type: unhashable, so no set lookup
        raise SeedLineError(lineno, f"is not a valid seed ({exc})") from None
    return seed


def _too_long() -> str:
    return f"is longer than the limit of {MAX_LINE_BYTES} bytes (2 MiB) per line"


def read_lines(stream: IO[bytes], max_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """Lines of a binary stream without their line ending, holding at most ~``max_bytes`` each.

    A longer line is yielded cut to more than ``max_bytes`` bytes (so :func:`parse_seed_line`
    rejects it and line numbers stay right) and the rest of it is skipped unread into memory.
    """
    limit = max_bytes + 2  # room for "\r\n" after a line of exactly max_bytes
    while True:
        chunk = stream.readline(limit)
        if not chunk:
            return
        if chunk.endswith(b"\n") or len(chunk) < limit:
            yield chunk.rstrip(b"\n").rstrip(b"\r")
            continue
        while True:  # over-long: drop the rest of the line
            rest = stream.readline(64 * 1024)
            if not rest or rest.endswith(b"\n"):
                break
        yield chunk


def parse_lines(lines: Iterable[str | bytes], on_error: Callable[[Rejection], None],
                summary: ExpandSummary) -> Iterator[tuple[int, SeedTask]]:
    """``(line number, seed)`` of each valid seed line; a bad line is reported to ``on_error``
    and counted in ``summary.bad_lines``, every line (blank ones too) in ``summary.lines``."""
    for lineno, line in enumerate(lines, start=1):
        summary.lines += 1
        if not line or line.isspace():  # (isspace: no copy of a 2 MiB line)
            continue
        try:
            seed = parse_seed_line(line, lineno)
        except SeedLineError as exc:
            summary.bad_lines += 1
            on_error(Rejection(lineno, exc.reason))
            continue
        yield lineno, seed


__all__ = ["MAX_LINE_BYTES", "SeedLineError", "parse_lines", "parse_seed_line", "read_lines"]

"""Progress of a long ``seed-expand`` on stderr: one redrawn line on a terminal, else plain
periodic lines (logs and CI keep every line)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from meteorseed_scrapy.seeding.expand_types import ExpandSummary


class Progress:
    """Call with the running summary after each batch; reports at most every ``interval``."""

    def __init__(self, stream: TextIO, *, interval: float | None = None) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._interval = interval if interval is not None else (0.5 if self._tty else 10.0)
        self._start = time.monotonic()
        self._last = self._start
        self._drawn = False

    def __call__(self, summary: ExpandSummary) -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        self._write(summary, now)

    def _write(self, summary: ExpandSummary, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        line = (f"seed-expand: {summary.expanded:,} URLs ({summary.expanded / elapsed:,.0f}/s), "
                f"enqueued {summary.enqueued:,}, duplicates {summary.duplicates:,}, "
                f"rejected {summary.rejected:,}, {summary.lines:,} lines")
        if self._tty:
            self._stream.write("\r\x1b[K" + line)
            self._drawn = True
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def done(self) -> None:
        """End the redrawn line (a terminal), so the summary starts on its own line."""
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()

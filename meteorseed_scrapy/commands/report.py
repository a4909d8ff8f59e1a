"""What ``scrapy seed-expand`` tells its user: one-line messages and rejected seeds on stderr
(its exit codes are :mod:`meteorseed_scrapy.exit_codes`). Light on purpose: the command
imports it even for ``--help``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meteorseed_scrapy.seeding.expand_types import ExpandSummary, Rejection


def say(message: str) -> None:
    print(f"seed-expand: {message}", file=sys.stderr, flush=True)


def report_rejection(rejection: Rejection) -> None:
    print(rejection, file=sys.stderr, flush=True)


def stopped_after(summary: ExpandSummary, dedup: bool) -> str:
    """How far a failed run got, to append to its one-line failure (empty before any line)."""
    if not summary.lines:
        return ""
    rerun = "; re-running skips the URLs already enqueued" if dedup else ""
    return f" (stopped after: {summary}{rerun})"

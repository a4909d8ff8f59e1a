"""Turning seeds (where data comes from) into exec tasks (one URL to fetch each)."""

from __future__ import annotations

from meteorseed_scrapy.seeding.expand import (
    MAX_LINE_BYTES,
    MAX_URLS_PER_LINE,
    ExpandSummary,
    Rejection,
    SeedLineError,
    UnsupportedTaskType,
    UrlError,
    expand,
    expand_stream,
    parse_seed_line,
    read_lines,
)

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_URLS_PER_LINE",
    "ExpandSummary",
    "Rejection",
    "SeedLineError",
    "UnsupportedTaskType",
    "UrlError",
    "expand",
    "expand_stream",
    "parse_seed_line",
    "read_lines",
]

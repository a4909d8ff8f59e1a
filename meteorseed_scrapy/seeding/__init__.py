"""Turning seeds (where data comes from) into exec tasks (one URL to fetch each), once
(``expand``) or on their schedules (``registry``, ``schedule``, ``seeder``)."""

from __future__ import annotations

from meteorseed_scrapy.seeding.expand import ExpandSummary, Rejection, expand_stream
from meteorseed_scrapy.seeding.payload import MAX_URLS_PER_LINE, UnsupportedTaskType
from meteorseed_scrapy.seeding.records import SeedRecord
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.schedule import Cron, Every, Schedule, parse_schedule
from meteorseed_scrapy.seeding.seed_lines import (
    MAX_LINE_BYTES,
    SeedLineError,
    parse_seed_line,
    read_lines,
)
from meteorseed_scrapy.seeding.seed_urls import UrlError, expand
from meteorseed_scrapy.seeding.seeder import Seeder, SeederConfig

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_URLS_PER_LINE",
    "Cron",
    "Every",
    "ExpandSummary",
    "Rejection",
    "Schedule",
    "SeedLineError",
    "SeedRecord",
    "SeedRegistry",
    "Seeder",
    "SeederConfig",
    "UnsupportedTaskType",
    "UrlError",
    "expand",
    "expand_stream",
    "parse_schedule",
    "parse_seed_line",
    "read_lines",
]

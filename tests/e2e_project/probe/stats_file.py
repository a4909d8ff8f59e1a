"""Writes the crawl's final stats as JSON to the file named by the PROBE_STATS_FILE setting."""

from __future__ import annotations

import json
from typing import Any

from scrapy import signals


class StatsFile:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.path = crawler.settings.get("PROBE_STATS_FILE")

    @classmethod
    def from_crawler(cls, crawler: Any) -> StatsFile:
        ext = cls(crawler)
        crawler.signals.connect(ext.closed, signals.engine_stopped)
        return ext

    def closed(self) -> None:
        if self.path:
            stats = self.crawler.stats.get_stats()
            with open(self.path, "w") as fh:
                json.dump(stats, fh, default=str)

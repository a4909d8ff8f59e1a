"""A Scrapy extension for the benchmarks: the longest the reactor was blocked, to a file.

A beat every 20 ms; each one that ends later than that is a block of the event loop, and the
longest so far is written to ``LOOP_LAG_FILE`` at once (the benchmarks kill the worker at its
ack, before any close signal).

    -s EXTENSIONS='{"loop_lag.LoopLag": 0}' -s LOOP_LAG_FILE=/tmp/lag
"""

from __future__ import annotations

import time
from pathlib import Path

from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from twisted.internet import task

BEAT_S = 0.02


class LoopLag:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.longest = 0.0
        self.last = time.monotonic()
        self.loop = task.LoopingCall(self._beat)
        self.loop.start(BEAT_S, now=False)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LoopLag:
        path = crawler.settings.get("LOOP_LAG_FILE")
        if not path:
            raise NotConfigured
        return cls(Path(path))

    def _beat(self) -> None:
        now = time.monotonic()
        late = now - self.last - BEAT_S
        self.last = now
        if late > self.longest:
            self.longest = late
            self.path.write_text(f"{late:.3f}")

"""Records when the first response arrived and when the last item was committed, and how long
each response took to become its item (response_received -> item_scraped, the same span for every
contender: the queueing of Scrapy's own engine at that load, which no scheduler removes).

``item_scraped`` is sent after every pipeline stage finished; with MeteorSeed's UpsertPipeline
that means after the store commit. Written as JSON to the ``BENCH_TIMING_FILE`` setting when
the engine stops, with the final stats.
"""

from __future__ import annotations

import json
import time
from typing import Any

from scrapy import signals


class Timing:
    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        self.path = crawler.settings.get("BENCH_TIMING_FILE")
        self.first_response: float | None = None
        self.last_response: float | None = None
        self.last_item: float | None = None
        self.cpu_first_response: float | None = None  # process CPU time (all threads)
        self.cpu_last_item: float | None = None
        self.responses = 0
        self.response_times: list[float] = []  # monotonic, for a timeline of the run
        self.item_times: list[float] = []
        self.items = 0
        self._received: dict[int, float] = {}  # id(response) -> when it was received
        self.item_latency_ms: list[float] = []

    @classmethod
    def from_crawler(cls, crawler: Any) -> Timing:
        ext = cls(crawler)
        crawler.signals.connect(ext.response_received, signals.response_received)
        crawler.signals.connect(ext.item_scraped, signals.item_scraped)
        crawler.signals.connect(ext.engine_stopped, signals.engine_stopped)
        return ext

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        now = time.monotonic()
        if self.first_response is None:
            self.first_response = now
            self.cpu_first_response = time.process_time()
        self.last_response = now
        self.response_times.append(now)
        self.responses += 1
        self._received[id(response)] = now

    def item_scraped(self, item: Any, response: Any, spider: Any) -> None:
        self.last_item = time.monotonic()
        received = self._received.pop(id(response), None)
        if received is not None:
            self.item_latency_ms.append((self.last_item - received) * 1000)
        self.cpu_last_item = time.process_time()
        self.item_times.append(self.last_item)
        self.items += 1

    def engine_stopped(self) -> None:
        if not self.path:
            return
        data = {
            "first_response": self.first_response,
            "last_response": self.last_response,
            "last_item": self.last_item,
            "engine_stopped": time.monotonic(),
            "cpu_first_response": self.cpu_first_response,
            "cpu_last_item": self.cpu_last_item,
            "responses": self.responses,
            "items": self.items,
            "stats": self.crawler.stats.get_stats(),
            "response_times": [round(t, 4) for t in self.response_times],
            "item_times": [round(t, 4) for t in self.item_times],
            "item_latency_ms": [round(t, 2) for t in self.item_latency_ms],
        }
        with open(self.path, "w") as fh:
            json.dump(data, fh, default=str)

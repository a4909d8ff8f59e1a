"""A loopback site whose latency grows with the load it is under, and that records when each
request arrived and left, for the adaptive politeness tests and benchmark.

Each answer takes ``base_ms + per_request_ms * (requests already in flight)``, times ``slowdown``
(set it to slow the site down mid-run). ``/robots.txt`` serves :attr:`LoadSite.robots`; every
other path is a small page. :meth:`LoadSite.in_flight` and :meth:`LoadSite.rate` are what the
server saw over a window: the time-averaged requests in flight, and the requests per second.
"""

from __future__ import annotations

import threading
import time

from meteorseed_scrapy.testing.loopback import LoopbackHandler, LoopbackSite


class _Handler(LoopbackHandler):
    site: LoadSite

    def serve(self, head: bool = False) -> None:
        site = self.site
        if self.path == "/robots.txt":
            self.send_page(200, "text/plain", site.robots.encode(), {}, head)
            return
        arrived = site.arrive()
        try:
            time.sleep(site.latency_for(arrived[1]))
            title = f"<html><head><title>{self.path}</title></head><body>ok</body></html>"
            self.send_page(200, "text/html", title.encode(), {}, head)
        finally:
            site.leave(arrived[0])


class LoadSite(LoopbackSite):
    handler = _Handler
    thread_name = "load-site"

    def __init__(self, base_ms: float = 50.0, per_request_ms: float = 25.0,
                 robots: str = "User-agent: *\nAllow: /\n", port: int = 0) -> None:
        super().__init__(port)
        self.base_ms, self.per_request_ms = base_ms, per_request_ms
        self.slowdown = 1.0
        self.robots = robots
        self._lock = threading.Lock()
        self._now = 0
        self._spans: list[list[float]] = []  # [arrived, left (0: still in flight)], monotonic

    def arrive(self) -> tuple[int, int]:
        """(this request's index, requests already in flight)."""
        with self._lock:
            self._spans.append([time.monotonic(), 0.0])
            busy = self._now
            self._now += 1
            return len(self._spans) - 1, busy

    def leave(self, index: int) -> None:
        with self._lock:
            self._spans[index][1] = time.monotonic()
            self._now -= 1

    def latency_for(self, busy: int) -> float:
        return (self.base_ms + self.per_request_ms * busy) * self.slowdown / 1000

    def arrivals(self) -> list[float]:
        with self._lock:
            return [s[0] for s in self._spans]

    def served(self) -> int:
        with self._lock:
            return sum(1 for s in self._spans if s[1])

    def in_flight(self, start: float, end: float) -> float:
        """Requests in flight at the server, averaged over [start, end] (monotonic times)."""
        if end <= start:
            return 0.0
        with self._lock:
            spans = [(a, b or time.monotonic()) for a, b in self._spans]
        busy = sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
        return busy / (end - start)

    def rate(self, start: float, end: float) -> float:
        """Requests that arrived in [start, end), per second."""
        if end <= start:
            return 0.0
        return sum(1 for a in self.arrivals() if start <= a < end) / (end - start)


__all__ = ["LoadSite"]

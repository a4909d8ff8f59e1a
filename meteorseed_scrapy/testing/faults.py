"""A loopback site that misbehaves on demand and records what it received, for politeness tests.

``with FaultSite() as site: site.url`` serves it from daemon threads (one per connection, so
many slow requests run at once); ``python -m meteorseed_scrapy.testing.faults --port N`` serves
it in the foreground. The first path segment names the "site": ``/a/page/1`` belongs to ``a``.

Each site has a mode, switched at run time with :meth:`FaultSite.set_mode` (or
``GET /_mode?site=a&mode=429&retry_after=3&times=1`` from outside):

* ``"ok"``: a fast page; ``"slow"``: the same page after ``delay`` seconds (default 1);
* a status code (``429``, ``403``, ``503``, …; ``retry_after=S`` adds ``Retry-After: S``);
* ``"reset"``: the connection is closed without a response (an RST: SO_LINGER 0).

``delay`` applies to every mode. With ``times=n`` and/or ``duration=s`` the mode is temporary:
it answers the next n requests (within s seconds from now) and then the site falls back to its
lasting mode (the last one set without ``times``/``duration``). Every page is a small
deterministic HTML document whose title names its path and query.

Every request (except the ``/_…`` control paths) is recorded as a :class:`Hit`: arrival and
finish times (``time.monotonic`` and wall clock), the site's in-flight count at arrival (itself
included) and the status sent (0 for a reset). A request stops counting as in flight just
before its response is written, so a client that sends its next request after reading a
response never makes the count overshoot. ``GET /_stats[?site=a][&hits=0]`` returns it as JSON;
``GET /_reset`` forgets everything recorded.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qs, urlsplit

from meteorseed_scrapy.testing.fault_modes import (
    RESET,
    Hit,
    Mode,
    Temporary,
    page,
    parse_mode,
    site_of,
)
from meteorseed_scrapy.testing.loopback import (
    LoopbackHandler,
    LoopbackSite,
    serve_until_interrupted,
)


class FaultSite(LoopbackSite):
    """The fault site, served from daemon threads while in a ``with`` block (or start/stop)."""

    thread_name = "fault-site"

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        super().__init__(port, host)
        self._lock = threading.Lock()
        self._hits: dict[str, list[Hit]] = {}
        self._in_flight: Counter[str] = Counter()
        self._modes: dict[str, Mode] = {}
        self._temporary: dict[str, Temporary] = {}

    # -- modes ---------------------------------------------------------------------------------
    def set_mode(self, site: str, mode: str | int = "ok", *, delay: float | None = None,
                 retry_after: float | str | None = None, times: int | None = None,
                 duration: float | None = None, from_first_hit: bool = False) -> None:
        """Switch ``site``'s behaviour now; with ``times``/``duration`` only for a while (with
        ``from_first_hit``, ``duration`` counts from the first request that meets the mode, so
        that an outage outlasts the crawlers' start-up however slow it is)."""
        parsed = parse_mode(mode, delay=delay, retry_after=retry_after)
        if times is not None and times < 1:
            raise ValueError("times must be at least 1")
        if duration is not None and duration <= 0:
            raise ValueError("duration must be positive")
        if from_first_hit and duration is None:
            raise ValueError("from_first_hit counts a duration: give one")
        site = site_of(site)
        with self._lock:
            if times is None and duration is None:
                self._modes[site] = parsed
                self._temporary.pop(site, None)
            elif from_first_hit:  # (a duration, checked above)
                self._temporary[site] = Temporary(parsed, times, None, duration)
            else:
                until = None if duration is None else time.monotonic() + duration
                self._temporary[site] = Temporary(parsed, times, until)

    def mode(self, site: str) -> Mode:
        """The mode the next request to ``site`` would get (without using up a temporary one)."""
        site = site_of(site)
        with self._lock:
            temporary = self._temporary.get(site)
            if temporary is not None and (temporary.until is None
                                          or time.monotonic() < temporary.until):
                return temporary.mode
            return self._modes.get(site, Mode())

    def _take_mode(self, site: str, now: float) -> Mode:
        temporary = self._temporary.get(site)
        if temporary is not None:
            if temporary.lasts is not None and temporary.until is None:  # the first to meet it
                temporary.until = now + temporary.lasts
            if temporary.until is not None and now >= temporary.until:
                del self._temporary[site]
            else:
                if temporary.remaining is not None:
                    temporary.remaining -= 1
                    if temporary.remaining <= 0:
                        del self._temporary[site]
                return temporary.mode
        return self._modes.get(site, Mode())

    # -- recording -----------------------------------------------------------------------------
    def arrive(self, target: str) -> tuple[Hit, Mode]:
        site = site_of(urlsplit(target).path)
        with self._lock:
            now = time.monotonic()
            self._in_flight[site] += 1
            hit = Hit(site, target, now, time.time(), self._in_flight[site])
            self._hits.setdefault(site, []).append(hit)
            return hit, self._take_mode(site, now)

    def leave(self, hit: Hit, status: int) -> None:
        """``hit`` is no longer in flight (called just before its response goes out)."""
        with self._lock:
            if hit.status is None:
                hit.status = status
                self._in_flight[hit.site] -= 1

    def done(self, hit: Hit) -> None:
        with self._lock:
            hit.finish, hit.finish_wall = time.monotonic(), time.time()

    def hits(self, site: str) -> list[Hit]:
        with self._lock:
            return [Hit(**asdict(h)) for h in self._hits.get(site_of(site), [])]

    def arrivals(self, site: str) -> list[float]:
        """Arrival times (``time.monotonic``) of the requests to ``site``, in order."""
        with self._lock:
            return [h.arrival for h in self._hits.get(site_of(site), [])]

    def max_in_flight(self, site: str) -> int:
        with self._lock:
            return max((h.in_flight for h in self._hits.get(site_of(site), [])), default=0)

    def in_flight(self, site: str) -> int:
        with self._lock:
            return self._in_flight[site_of(site)]

    def rate(self, site: str, start: float | None = None, end: float | None = None) -> float:
        """Arrivals per second in ``[start, end)`` (monotonic); by default from the first
        arrival to the last, i.e. ``(n - 1) / span``. 0.0 when the span is empty."""
        times = self.arrivals(site)
        if not times:
            return 0.0
        start = times[0] if start is None else start
        end = times[-1] if end is None else end
        if end <= start:
            return 0.0
        return sum(start <= t < end for t in times) / (end - start)

    def sites(self) -> list[str]:
        with self._lock:
            return sorted(self._hits)

    def reset(self) -> None:
        """Forget every recorded request (modes and in-flight counts stay)."""
        with self._lock:
            self._hits.clear()

    def stats(self, site: str | None = None, with_hits: bool = True) -> dict[str, Any]:
        names = [site_of(site)] if site is not None else self.sites()
        out: dict[str, Any] = {}
        for name in names:
            hits = self.hits(name)
            out[name] = {"requests": len(hits), "max_in_flight": self.max_in_flight(name),
                         "in_flight": self.in_flight(name),
                         "statuses": dict(Counter(str(h.status) for h in hits))}
            if with_hits:
                out[name]["hits"] = [asdict(h) for h in hits]
        return {"now": time.monotonic(), "now_wall": time.time(), "sites": out}

    def control(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """The ``/_stats``, ``/_mode`` and ``/_reset`` endpoints."""
        one = {k: v[0] for k, v in query.items()}
        try:
            if path == "/_stats":
                return 200, self.stats(one.get("site"), one.get("hits", "1") != "0")
            if path == "/_reset":
                self.reset()
                return 200, {"reset": True}
            if path == "/_mode" and "site" in one:
                self.set_mode(
                    one["site"], one.get("mode", "ok"),
                    delay=float(one["delay"]) if "delay" in one else None,
                    retry_after=one.get("retry_after"),
                    times=int(one["times"]) if "times" in one else None,
                    duration=float(one["duration"]) if "duration" in one else None)
                return 200, {"site": site_of(one["site"]), "mode": asdict(self.mode(one["site"]))}
        except ValueError as exc:
            return 400, {"error": str(exc)}
        return 404, {"error": "control paths: /_stats, /_mode?site=..&mode=.., /_reset"}

class _Handler(LoopbackHandler):
    server_version = "MeteorSeedFaults/1.0"
    timeout = 60
    site: FaultSite

    def serve(self, head: bool = False) -> None:
        parts = urlsplit(self.path)
        if parts.path.startswith("/_"):
            status, data = self.site.control(parts.path, parse_qs(parts.query))
            self.send_page(status, "application/json", json.dumps(data).encode(), {}, head)
            return
        hit, mode = self.site.arrive(self.path)
        try:
            if mode.delay:
                time.sleep(mode.delay)
            self.site.leave(hit, mode.status)
            if mode.status == RESET:
                self._reset()
                return
            headers = {"Retry-After": mode.retry_after} if mode.retry_after is not None else {}
            self.send_page(mode.status, "text/html; charset=utf-8", page(self.path, mode.status),
                       headers, head)
        except OSError:  # the client went away
            self.close_connection = True
        finally:
            self.site.leave(hit, mode.status)  # no-op unless something above failed first
            self.site.done(hit)

    def _reset(self) -> None:
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()


FaultSite.handler = _Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the MeteorSeed fault site on loopback.")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    args = parser.parse_args(argv)
    try:
        site = FaultSite(args.port, args.host)
    except ValueError as exc:
        parser.error(str(exc))
    serve_until_interrupted(site, lambda started: started.url)


__all__ = ["FaultSite"]


if __name__ == "__main__":
    main()

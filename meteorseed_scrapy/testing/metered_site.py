"""The demo site, also measuring what it serves, for fleet tests and the scale-out benchmark.

``python -m meteorseed_scrapy.testing.metered_site --host 10.213.x.y`` serves it on an address of
a fleet's test bridge (:mod:`meteorseed_scrapy.testing.netns`), from inside the site's namespace;
:func:`meter` reads its measures from the root namespace.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import sys
import threading
import time
from itertools import pairwise
from typing import Any
from urllib.request import urlopen

from meteorseed_scrapy.testing.demo_pages import json_reply
from meteorseed_scrapy.testing.netns import SITE_PORT, TEST_RANGE
from meteorseed_scrapy.testing.sites import DemoSite, Reply


class MeteredSite(DemoSite):
    """The demo site, also measuring what it serves: ``GET /meter`` says how many requests were
    in flight at most, when the first and last began, the most begun in one second and the
    longest pause between two."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meter = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.starts: list[float] = []

    def handle(self, target: str) -> Reply:
        if target.startswith("/meter"):
            return json_reply(self.meter(reset="reset" in target))
        with self._meter:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.starts.append(time.time())
        try:
            return super().handle(target)
        finally:
            with self._meter:
                self.in_flight -= 1

    def meter(self, reset: bool = False) -> dict[str, Any]:
        with self._meter:
            starts = sorted(self.starts)
            out = {"requests": len(starts), "max_in_flight": self.max_in_flight,
                   "first": starts[0] if starts else None, "last": starts[-1] if starts else None,
                   "max_per_second": _max_in_window(starts, 1.0),
                   # the longest the site went without a new request, between first and last
                   "max_gap": max((b - a for a, b in pairwise(starts)), default=0.0)}
            if reset:
                self.starts.clear()
                self.max_in_flight = self.in_flight
        return out


def _max_in_window(starts: list[float], width: float) -> int:
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while t - starts[lo] >= width:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def meter(site_url: str, reset: bool = False) -> dict[str, Any]:
    """The :class:`MeteredSite`'s measures, read from the root namespace."""
    with urlopen(f"{site_url}/meter{'?reset=1' if reset else ''}", timeout=10) as reply:
        result: dict[str, Any] = json.loads(reply.read())
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--host", required=True, help=f"an address in {TEST_RANGE}")
    parser.add_argument("--port", type=int, default=SITE_PORT)
    args = parser.parse_args(argv)
    if ipaddress.ip_address(args.host) not in TEST_RANGE:
        parser.error(f"--host must be in the test range {TEST_RANGE}")
    site = MeteredSite(args.port)
    # The demo site guards against serving beyond loopback; inside a fleet namespace the only
    # other address is this test bridge's, so bind it there.
    site.host = args.host
    with site:
        print(f"serving {site.url}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()

"""A loopback site serving sitemaps for tests and benchmarks: pages, redirects, robots.txt,
and hostile answers (a body or headers dripped a byte at a time, until the client gives up or
the site stops). It records the path and headers of every request it gets."""

from __future__ import annotations

import contextlib
import threading

from meteorseed_scrapy.testing.loopback import LoopbackHandler, LoopbackSite

SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"


def urlset(urls: list[str]) -> bytes:
    locs = "".join(f"<url><loc>{url}</loc></url>" for url in urls)
    return f'<?xml version="1.0"?><urlset xmlns="{SITEMAP_NS}">{locs}</urlset>'.encode()


class SitemapHost(LoopbackSite):
    """``pages``: path -> body (200); ``redirects``: path -> (status, Location); ``drips``:
    path -> seconds between the bytes of a sitemap body that never ends; ``slow_headers``:
    likewise for a status line and headers that never end. Anything else is a 404."""

    thread_name = "sitemap-host"

    def __init__(self, host: str = "127.0.0.1") -> None:
        super().__init__(host=host)
        self.pages: dict[str, bytes] = {}
        self.redirects: dict[str, tuple[int, str]] = {}
        self.drips: dict[str, float] = {}
        self.slow_headers: dict[str, float] = {}
        #: (path, headers) of each request, in order
        self.requests: list[tuple[str, dict[str, str]]] = []
        #: set when a dripped answer has started (the client is waiting on it)
        self.dripping = threading.Event()
        #: dripped answers started, and ended (by the client going away, or end_drips)
        self.drips_started = 0
        self.drips_ended = 0
        self._count = threading.Lock()
        self._closing = threading.Event()

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def end_drips(self) -> None:
        """End the dripped answers under way (each closes its connection, short)."""
        self._closing.set()

    def stop(self) -> None:
        self.end_drips()
        super().stop()

    class handler(LoopbackHandler):  # (the attribute name LoopbackSite expects)
        site: SitemapHost

        def handle(self) -> None:
            # A client that closes with an answer unread (a refused robots.txt, a cancelled
            # fetch) resets the connection: that is its right, not a server error.
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                super().handle()

        def serve(self, head: bool = False) -> None:
            site, path = self.site, self.path
            site.requests.append((path, dict(self.headers.items())))
            if path in site.redirects:
                status, location = site.redirects[path]
                self.send_page(status, "text/plain", b"", {"Location": location}, head)
            elif path in site.drips:
                self.send_response(200)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(10**9))
                self.end_headers()
                self._drip(f'<urlset xmlns="{SITEMAP_NS}">'.encode(), b" ", site.drips[path])
            elif path in site.slow_headers:
                self._drip(b"HTTP/1.1 200 OK\r\nX-Slow: ", b"y", site.slow_headers[path])
            elif path in site.pages:
                self.send_page(200, "application/xml", site.pages[path], {}, head)
            else:
                self.send_page(404, "text/plain", b"none here", {}, head)

        def _drip(self, first: bytes, then: bytes, interval: float) -> None:
            site = self.site
            self.close_connection = True
            with site._count:
                site.drips_started += 1
            try:
                self.wfile.write(first)
                self.wfile.flush()
                site.dripping.set()
                while not site._closing.wait(interval):
                    self.wfile.write(then)
                    self.wfile.flush()
            except OSError:
                pass  # the client went away: what it was meant to do
            finally:
                with site._count:
                    site.drips_ended += 1


__all__ = ["SITEMAP_NS", "SitemapHost", "urlset"]

"""What the local test sites share: a threaded HTTP server on loopback, started and stopped
around a ``with`` block."""

from __future__ import annotations

import ipaddress
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, TypeVar

_S = TypeVar("_S", bound="LoopbackSite")


class LoopbackHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 512

    def server_bind(self) -> None:
        # HTTPServer names itself with socket.getfqdn(host): on a test namespace's address
        # (testing/netns.py) that is a reverse DNS query leaving the machine.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class LoopbackHandler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1, quiet; subclasses implement :meth:`serve`."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no delayed-ACK stall

    def do_GET(self) -> None:
        self.serve()

    def do_HEAD(self) -> None:
        self.serve(head=True)

    def serve(self, head: bool = False) -> None:
        raise NotImplementedError

    def send_page(self, status: int, ctype: str, payload: bytes, headers: dict[str, str],
                  head: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(payload)
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class LoopbackSite:
    """Serves ``handler`` (whose ``site`` attribute is set to this object) from daemon threads."""

    handler: type[LoopbackHandler]
    thread_name = "loopback-site"

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        if not ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            raise ValueError(f"{type(self).__name__} serves loopback only, not {host!r}")
        self.host, self.port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self: _S) -> _S:
        handler: Any = type("Handler", (self.handler,), {"site": self})
        self._server = LoopbackHTTPServer((self.host, self.port), handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name=self.thread_name,
                                        kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def serve_until_interrupted(site: _S, banner: Callable[[_S], str]) -> None:
    """Serve ``site`` in the foreground (``python -m …``), printing ``banner(site)`` once it is
    listening, until Ctrl-C."""
    with site:
        print(banner(site), flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass

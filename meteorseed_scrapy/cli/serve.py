"""``meteorseed serve``: the HTTP dispatch API and the web console (docs/api.md, console.md).

It refuses to start without a token (``METEORSEED_API_TOKEN`` or ``--token``) unless
``--insecure-no-auth`` says so explicitly. SIGINT/SIGTERM stop it gracefully: background
expansions are cancelled, open requests finish, connections close.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.cli.common import (
    CliError,
    Context,
    add_target_options,
    cli_settings,
    dedup_keys,
    project_fingerprinter,
    resolve_target,
)
from meteorseed_scrapy.exit_codes import EXIT_OK
from meteorseed_scrapy.settings import (
    DEFAULTS,
    flag_setting,
    integer_setting,
    setting,
    text_setting,
)

if TYPE_CHECKING:
    from aiohttp import web

    from meteorseed_scrapy.queue.enqueue.dedup import Fingerprinter

TOKEN_ENV = "METEORSEED_API_TOKEN"


def register(sub: Any) -> None:
    parser = sub.add_parser("serve", help="HTTP dispatch API and web console")
    add_target_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default "
                        "127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    parser.add_argument("--token", help=f"bearer token (default: env {TOKEN_ENV}); prefer the "
                        "environment: a flag shows in the process list")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="serve without any token (only on a trusted network)")
    parser.add_argument("--sites-dir", help="site rule files, for allowed domains, besides "
                        "those pushed to Redis (default: env METEORSEED_SITES_DIR)")
    parser.add_argument("--store-uri", help="store with the anomalies shown on the sites page "
                        "(default: env METEORSEED_STORE_URI; none: anomalies not shown)")
    parser.add_argument("--max-backlog", type=int,
                        help="tasks waiting above which a dispatch waits for workers (default: "
                        f"env METEORSEED_MAX_BACKLOG, else {DEFAULTS['METEORSEED_MAX_BACKLOG']})")
    parser.set_defaults(run=run)


def config_from(args: argparse.Namespace, shards: int = 1,
                fingerprinter: Fingerprinter | None = None) -> Any:
    from meteorseed_scrapy.api.config import ApiConfig
    from meteorseed_scrapy.observability.notify import NotifyConfig
    from meteorseed_scrapy.seeding.addresses import PRIVATE_SETTING

    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token is None and not args.insecure_no_auth:
        raise CliError(f"serve: no API token; set {TOKEN_ENV} (or --token), or pass "
                       "--insecure-no-auth to serve without one")
    if token is not None and args.insecure_no_auth:
        raise CliError("serve: --insecure-no-auth with a token: choose one")
    if not 0 < args.port < 65536:
        raise CliError(f"serve: --port must be 1-65535, got {args.port}")
    settings = cli_settings()
    sites_dir = args.sites_dir or text_setting(settings, "METEORSEED_SITES_DIR") or None
    if sites_dir is not None and not os.path.isdir(sites_dir):
        raise CliError(f"serve: --sites-dir / METEORSEED_SITES_DIR {sites_dir!r} is not a "
                       "directory")
    url, namespace = resolve_target(args.redis_url, args.namespace)
    try:
        return ApiConfig(
            redis_url=url, namespace=namespace, token=token,
            sites_dir=sites_dir,
            store_uri=args.store_uri or setting(settings, "METEORSEED_STORE_URI"),
            max_backlog=integer_setting(
                settings, "METEORSEED_MAX_BACKLOG", minimum=0
            ) if args.max_backlog is None else args.max_backlog,
            shards=shards,
            fetch_private_addresses=flag_setting(settings, PRIVATE_SETTING),
            fingerprinter=fingerprinter,
            notify=NotifyConfig.from_settings(settings),
        )
    except ValueError as exc:
        raise CliError(f"serve: {exc}") from None


def run(args: argparse.Namespace, ctx: Context) -> int:
    from meteorseed_scrapy.api.app import create_app

    # (the shard count the namespace recorded; the dedup keys of the project run in, if any)
    config = config_from(args, ctx.keys.shards, project_fingerprinter(ctx))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(name)s] %(levelname)s: "
                        "%(message)s")
    if ctx.json:  # --json: log lines as JSON objects, as workers with METEORSEED_LOG_JSON
        from meteorseed_scrapy.observability.logging import install

        install(logging.getLogger().handlers, json_lines=True)
    if config.token is None:
        ctx.warn("serving WITHOUT authentication (--insecure-no-auth)")
    ctx.warn(f"dispatch API on http://{args.host}:{args.port}/ (console /console/, "
             f"OpenAPI /openapi.json), Redis {ctx.url}, namespace {config.namespace}, "
             f"dedup keys: {dedup_keys(config.fingerprinter)}")
    try:
        asyncio.run(_serve(create_app(config), args.host, args.port))
    except OSError as exc:  # the port is taken, the address is not ours
        raise CliError(f"serve: cannot listen on {args.host}:{args.port}: {exc}") from None
    return EXIT_OK


async def _serve(app: web.Application, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully: shutdown hooks (background
    expansions cancelled and handed back), open requests finished, cleanup.

    The signals only set an event here. ``web.run_app`` raises its exit exception from inside
    whatever callback the loop is running when the signal comes, which can be the one that
    hands a worker thread's result to a background expansion; that expansion then never
    resumed and the shutdown waited for it (measured: 1 stop in 4 took ~24 s instead of
    0.2 s).
    """
    from meteorseed_scrapy.api import guard

    runner = guard.runner(app)
    await runner.setup()
    try:
        await guard.site(runner, host, port).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()

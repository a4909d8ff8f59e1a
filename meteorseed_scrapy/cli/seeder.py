"""``meteorseed seeder [FILE|-]``: the long-running seeder (re-expands due seeds), and
``meteorseed seeder --list``: the seed registry with each seed's run state.

The seeder itself is :func:`meteorseed_scrapy.seeding.runner.watch`, shared with
``scrapy seed-expand --watch``; it runs on its own asyncio client (the CLI's synchronous one
is only used by ``--list``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from meteorseed_scrapy.cli.common import (
    CliError,
    Context,
    add_target_options,
    cli_settings,
    dedup_keys,
    project_fingerprinter,
    resolve_target,
    table,
    utc_time,
)
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.seeding import runner
from meteorseed_scrapy.seeding.adapt import MAX_INTERVAL_SETTING, MIN_INTERVAL_SETTING
from meteorseed_scrapy.seeding.addresses import PRIVATE_SETTING
from meteorseed_scrapy.seeding.records import SeedRecord
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.seeder import SeederConfig
from meteorseed_scrapy.settings import DEFAULTS, flag_setting, setting
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.validators import format_duration, to_integer

#: Most seeds ``--list`` shows.
LIST_LIMIT = 1000


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "seeder", help="run the seeder: re-expand due seeds (schedules); --list shows them",
        description="Register FILE's seeds (JSON Lines; - reads stdin; re-read when the file "
        "changes) in the seed registry, then run every seed when it is due, until SIGINT or "
        "SIGTERM (exit code 0). Any number of seeders may run against one namespace.")
    add_target_options(parser)
    parser.add_argument("file", nargs="?", metavar="FILE|-", help="seeds to register first")
    parser.add_argument("--list", action="store_true",
                        help="print the registered seeds and their run state, then exit")
    parser.add_argument("--site", help="with --list: only this site's seeds")
    parser.add_argument("--min-interval", help=f"shortest adaptive interval (default: "
                        f"{MIN_INTERVAL_SETTING}, else 10m)")
    parser.add_argument("--max-interval", help=f"longest adaptive interval (default: "
                        f"{MAX_INTERVAL_SETTING}, else 2h)")
    parser.add_argument("--sites-dir", help="site rule files whose schedule: {min, max} bound "
                        "their seeds (default: METEORSEED_SITES_DIR)")
    parser.add_argument("--lease", type=float, default=600.0, metavar="SECONDS",
                        help="how long a claimed seed is this seeder's (renewed while it "
                        "runs; default 600)")
    parser.add_argument("--max-backlog", type=int, metavar="N",
                        help="pause while more tasks wait in the stream (default: "
                        f"METEORSEED_MAX_BACKLOG, else {DEFAULTS['METEORSEED_MAX_BACKLOG']})")
    parser.set_defaults(run=run)


def _setting(name: str, flag: Any) -> Any:
    """A flag, else the setting as every command resolves it (:func:`cli_settings`)."""
    return flag if flag is not None else setting(cli_settings(), name)


def run(args: argparse.Namespace, ctx: Context) -> int:
    if args.list:
        return _list(args, ctx)
    if args.file and args.file != "-" and not os.path.isfile(args.file):
        raise CliError(f"cannot read {args.file}: no such file")
    overrides = {MIN_INTERVAL_SETTING: args.min_interval, MAX_INTERVAL_SETTING: args.max_interval}
    try:
        bounds = runner.bounds_from(lambda name: _setting(name, overrides.get(name)))
        backlog = _setting("METEORSEED_MAX_BACKLOG", args.max_backlog)
        config = SeederConfig(lease_s=args.lease, max_backlog=to_integer(
            backlog, "METEORSEED_MAX_BACKLOG", minimum=0),
            # keyed as the project's workers key their dedup records (queue/enqueue/dedup.py)
            fingerprinter=project_fingerprinter(ctx))
        private = flag_setting(lambda name: _setting(name, None), PRIVATE_SETTING)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    url, _ = resolve_target(args.redis_url, args.namespace)  # ctx.url is redacted

    def say(line: str) -> None:
        print(f"meteorseed seeder: {line}", file=ctx.err, flush=True)

    runner.log_to(ctx.err)
    say(f"dedup keys: {dedup_keys(config.fingerprinter)}")
    sites = SiteConfigs(_setting("METEORSEED_SITES_DIR", args.sites_dir))
    return asyncio.run(runner.watch(
        url, ctx.keys, seed_file=args.file, config=config, sites=sites, bounds=bounds, say=say,
        on_error=lambda rejection: print(rejection, file=ctx.err, flush=True),
        stdin=sys.stdin.buffer if args.file == "-" else None, private_addresses=private))



def _list(args: argparse.Namespace, ctx: Context) -> int:
    url, _ = resolve_target(args.redis_url, args.namespace)

    async def fetch() -> list[SeedRecord]:
        client = async_client(url, socket_connect_timeout=5, socket_timeout=30)
        try:
            return await SeedRegistry(client, ctx.keys).list(site_id=args.site, limit=LIST_LIMIT)
        finally:
            await client.aclose()

    records = asyncio.run(fetch())
    if ctx.json:
        ctx.emit_json([r.to_json() for r in records])
        return 0
    if not records:
        ctx.say("no seeds registered")
        return 0
    rows = [{"seed": r.seed_id, "site": r.seed.site_id, "status": r.status,
             "runs": r.runs, "failures": r.failures, "yield": r.last_yield,
             "interval": format_duration(r.interval_s) if r.interval_s else None,
             "last_run": utc_time(r.last_run), "next_due": utc_time(r.next_due),
             "last_error": r.last_error} for r in records]
    ctx.say("\n".join(table(rows, ("seed", "site", "status", "runs", "failures", "yield",
                                   "interval", "last_run", "next_due", "last_error"))))
    if len(records) == LIST_LIMIT:
        ctx.say(f"(first {LIST_LIMIT} seeds only)")
    return 0

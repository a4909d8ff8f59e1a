"""``meteorseed sites push DIR | list | rm SITE... | check DIR | try SITE URL|FILE | schema``,
and ``pause | resume | limit | controls`` (:mod:`meteorseed_scrapy.cli.site_control`).

``push`` validates every rule file of DIR as a worker would and stores them all in one
transaction, or none when any is bad (each problem printed as ``file: field: problem``).
Workers with ``METEORSEED_SITES_REDIS = True`` pick changes up within their reload interval
(``METEORSEED_SITES_RELOAD_INTERVAL``, 1 s). See :mod:`meteorseed_scrapy.sites.remote`.

``check``, ``try`` and ``schema`` work on files alone, without Redis: ``check`` validates every
rule file (exit 1 when any is bad), ``try`` parses one page with a site's rules (see
:mod:`meteorseed_scrapy.cli.site_try`), ``schema`` prints the JSON Schema of the rule format.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO, Any

from meteorseed_scrapy.cli.common import (
    CliError,
    Context,
    add_target_options,
    table,
)
from meteorseed_scrapy.cli.site_control import register as register_control
from meteorseed_scrapy.cli.site_reparse import register as register_reparse
from meteorseed_scrapy.cli.site_try import load_rules, offline_context
from meteorseed_scrapy.cli.site_try import register as register_try
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.remote import RemoteRules, collect
from meteorseed_scrapy.sites.schema import rule_schema


def register(sub: Any) -> None:
    sites = sub.add_parser("sites", help="site rule files: push, list, rm (in Redis); check,"
                           " try, schema (files only); reparse (cached pages); pause, resume,"
                           " limit, controls")
    actions = sites.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("push", help="validate the rule files of DIR and store them all")
    p.add_argument("directory", type=Path, metavar="DIR")
    p.add_argument("--prune", action="store_true",
                   help="also remove pushed sites that DIR no longer defines")
    add_target_options(p)
    p.set_defaults(run=run_push)
    p = actions.add_parser("list", help="the pushed sites, their versions and sources")
    add_target_options(p)
    p.set_defaults(run=run_list)
    p = actions.add_parser("rm", help="remove pushed sites (workers drop them)")
    p.add_argument("site_ids", nargs="+", metavar="SITE")
    add_target_options(p)
    p.set_defaults(run=run_rm)
    p = actions.add_parser("check", help="validate rule files offline; exit 1 when any is bad")
    p.add_argument("paths", nargs="+", type=Path, metavar="DIR|FILE")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run_offline=run_check)
    register_try(actions)
    register_reparse(actions)
    register_control(actions)
    p = actions.add_parser("schema", help="the JSON Schema of the rule-file format")
    p.set_defaults(run_offline=run_schema)


def run_push(args: argparse.Namespace, ctx: Context) -> int:
    try:
        pushed = collect(args.directory)
    except RuleError as exc:
        raise CliError(str(exc), EXIT_INCOMPLETE) from None
    removed = RemoteRules(ctx.client, ctx.keys).push(pushed, prune=args.prune)
    if ctx.json:
        ctx.emit_json({"pushed": {p.config.site_id: p.config.version for p in pushed},
                       "removed": removed, "key": ctx.keys.sites})
        return EXIT_OK
    for p in pushed:
        ctx.say(f"pushed {p.config.site_id} version {p.config.version} ({p.source})")
    for site_id in removed:
        ctx.say(f"removed {site_id}")
    ctx.say(f"{len(pushed)} sites in {ctx.keys.sites} at {ctx.url}")
    return EXIT_OK


def run_list(args: argparse.Namespace, ctx: Context) -> int:
    entries = RemoteRules(ctx.client, ctx.keys).entries()
    if ctx.json:
        ctx.emit_json({site: {k: v for k, v in record.items() if k != "text"}
                       for site, record in entries.items()})
        return EXIT_OK
    rows = [{"site": site, **record} for site, record in entries.items()]
    for line in table(rows, ["site", "version", "source", "pushed_at", "error"]):
        ctx.say(line)
    return EXIT_OK


def run_rm(args: argparse.Namespace, ctx: Context) -> int:
    deleted = RemoteRules(ctx.client, ctx.keys).remove(args.site_ids)
    missing = len(args.site_ids) - deleted
    if ctx.json:
        ctx.emit_json({"removed": deleted, "missing": missing})
    else:
        ctx.say(f"removed {deleted} of {len(args.site_ids)} sites from {ctx.keys.sites}")
    return EXIT_OK if not missing else EXIT_INCOMPLETE


def run_check(args: argparse.Namespace, out: IO[str], err: IO[str], stdin: IO[str]) -> int:
    ctx = offline_context(args, out, err, stdin)
    loaded = load_rules(args.paths)
    if ctx.json:
        ctx.emit_json({"valid": {c.site_id: c.source for c in loaded.configs.values()},
                       "errors": [{"source": e.source, "path": e.path, "problem": e.problem}
                                  for e in loaded.errors]})
    else:
        for config in loaded.configs.values():
            ctx.say(f"ok {config.source}: {config.site_id} version {config.version}")
        for error in loaded.errors:
            ctx.say(str(error))
        ctx.say(f"{len(loaded.configs)} valid, {len(loaded.errors)} invalid")
    return EXIT_INCOMPLETE if loaded.errors or not loaded.configs else EXIT_OK


def run_schema(args: argparse.Namespace, out: IO[str], err: IO[str], stdin: IO[str]) -> int:
    offline_context(args, out, err, stdin).emit_json(rule_schema())
    return EXIT_OK

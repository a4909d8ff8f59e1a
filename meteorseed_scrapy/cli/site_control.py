"""``meteorseed sites pause|resume SITE``, ``sites limit SITE --rate R --concurrency C`` (or
``--reset``), ``sites controls``: an operator's hand on a site, fleet-wide, within seconds
(:mod:`meteorseed_scrapy.politeness.control`). Each action is logged with who and when, and
appended to the namespace's event stream."""

from __future__ import annotations

import argparse
import getpass
import socket
from typing import Any

from meteorseed_scrapy.cli.common import CliError, Context, add_target_options, table
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.politeness import control
from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.validators import ConfigError, to_integer, to_number


def register(actions: Any) -> None:
    p = actions.add_parser("pause", help="hold a site fleet-wide: nothing fetched, nothing "
                                         "lost, until resumed")
    _site_arguments(p)
    p.add_argument("--reason", default="", help="why (kept with the hold, shown by controls)")
    p.set_defaults(run=run_pause)
    p = actions.add_parser("resume", help="let a held site go: its parked tasks due now")
    _site_arguments(p)
    p.set_defaults(run=run_resume)
    p = actions.add_parser("limit", help="set a site's rate and/or concurrency fleet-wide, "
                                         "over its rule file, until --reset")
    _site_arguments(p)
    p.add_argument("--rate", help="requests a second, fleet-wide")
    p.add_argument("--concurrency", help="requests in flight, fleet-wide")
    p.add_argument("--reset", action="store_true", help="back to the site's own limits")
    p.set_defaults(run=run_limit)
    p = actions.add_parser("controls", help="held sites and overridden limits: who, when, why")
    add_target_options(p)
    p.set_defaults(run=run_controls)


def _site_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("site", metavar="SITE")
    p.add_argument("--quota", default=None,
                   help="the site's quota key (default: its pushed rule file's, else SITE)")
    add_target_options(p)


def operator() -> str:
    """Who acts: the OS user at this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _ref(args: argparse.Namespace, ctx: Context) -> control.SiteRef:
    quota = args.quota
    if quota is None:
        config = SiteRegistry(None, RemoteRules(ctx.client, ctx.keys)).load().get(args.site)
        quota = config.limits.quota_key if config is not None else None
    try:
        return control.SiteRef(args.site, quota or "")
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run_pause(args: argparse.Namespace, ctx: Context) -> int:
    ref = _ref(args, ctx)
    new = control.hold(ctx.client, ctx.keys, ref, operator(), args.reason)
    if ctx.json:
        ctx.emit_json({"site": ref.site, "held": True, "already": not new})
    else:
        ctx.say(f"{ref.site} held fleet-wide" if new else f"{ref.site} was held already")
    return EXIT_OK


def run_resume(args: argparse.Namespace, ctx: Context) -> int:
    ref = _ref(args, ctx)
    woken = control.release(ctx.client, ctx.keys, ref, operator())
    if ctx.json:
        ctx.emit_json({"site": ref.site, "was_held": woken is not None, "woken": woken or 0})
    elif woken is None:
        ctx.say(f"{ref.site} was not held")
    else:
        ctx.say(f"{ref.site} resumed: {woken} parked task(s) due now")
    return EXIT_OK if woken is not None else EXIT_INCOMPLETE


def run_limit(args: argparse.Namespace, ctx: Context) -> int:
    ref = _ref(args, ctx)
    if args.reset:
        if args.rate is not None or args.concurrency is not None:
            raise CliError("--reset goes alone (no --rate, no --concurrency)")
        gone = control.unlimit(ctx.client, ctx.keys, ref, operator())
        ctx.say(f"{ref.site}: back to its own limits" if gone
                else f"{ref.site}: no limits were overridden")
        return EXIT_OK if gone else EXIT_INCOMPLETE
    try:
        rate = None if args.rate is None else to_number(args.rate, "--rate", positive=True)
        concurrency = None if args.concurrency is None else to_integer(
            args.concurrency, "--concurrency", minimum=1)
        control.limit(ctx.client, ctx.keys, ref, operator(), rate=rate,
                      concurrency=concurrency)
    except (ConfigError, ValueError) as exc:
        raise CliError(str(exc)) from None
    shown = ", ".join(f"{k} {v}" for k, v in (("rate", rate), ("concurrency", concurrency))
                      if v is not None)
    ctx.say(f"{ref.site}: {shown}, fleet-wide until `meteorseed sites limit {ref.site} "
            "--reset`")
    return EXIT_OK


def run_controls(args: argparse.Namespace, ctx: Context) -> int:
    found = control.controls(ctx.client, ctx.keys)
    if ctx.json:
        ctx.emit_json(found)
        return EXIT_OK
    if not found:
        ctx.say("no site is held or has its limits overridden")
        return EXIT_OK
    rows = []
    for site, record in sorted(found.items()):
        held, override = record.get("held") or {}, record.get("override") or {}
        rows.append({"site": site, "held_by": held.get("by", ""),
                     "reason": held.get("reason", ""),
                     "rate": override.get("rate", ""),
                     "concurrency": override.get("concurrency", ""),
                     "limited_by": override.get("by", "")})
    for line in table(rows, ["site", "held_by", "reason", "rate", "concurrency", "limited_by"]):
        ctx.say(line)
    return EXIT_OK

"""``meteorseed seeds pause|resume|cancel SEED`` and ``seeds controls``: an operator's hand on a
seed, fleet-wide, within a second (:mod:`meteorseed_scrapy.queue.consume.seed_control`). Each
action is logged with who and when, and appended to the namespace's event stream."""

from __future__ import annotations

import argparse
from typing import Any

from meteorseed_scrapy.cli.common import CliError, Context, add_target_options, table, utc_time
from meteorseed_scrapy.cli.site_control import operator
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.queue.consume import seed_control


def register(actions: Any) -> None:
    p = actions.add_parser("pause", help="hold a seed fleet-wide: none of its tasks fetched, "
                                         "nothing lost, until resumed")
    _seed_arguments(p)
    p.add_argument("--reason", default="", help="why (kept with the hold, shown by controls)")
    p.set_defaults(run=run_pause)
    p = actions.add_parser("resume", help="let a held seed go: its parked tasks due now")
    _seed_arguments(p)
    p.set_defaults(run=run_resume)
    p = actions.add_parser("cancel", help="cancel a seed: its waiting and delayed tasks "
                                          "removed and counted, in-flight ones finish")
    _seed_arguments(p)
    p.set_defaults(run=run_cancel)
    p = actions.add_parser("controls", help="held and cancelled seeds: who, when, why")
    add_target_options(p)
    p.set_defaults(run=run_controls)


def _seed_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("seed_id", metavar="SEED")
    p.add_argument("--by", default=None, help="who acts (default: user@host)")
    add_target_options(p)


def _checked(args: argparse.Namespace) -> tuple[str, str]:
    try:
        return seed_control.checked(args.seed_id), args.by or operator()
    except ValueError as exc:
        raise CliError(str(exc)) from None


def run_pause(args: argparse.Namespace, ctx: Context) -> int:
    seed_id, by = _checked(args)
    new = seed_control.hold(ctx.client, ctx.keys, seed_id, by, args.reason)
    if ctx.json:
        ctx.emit_json({"seed_id": seed_id, "held": True, "already": not new})
    else:
        ctx.say(f"seed {seed_id} held fleet-wide" if new else f"seed {seed_id} was held already")
    return EXIT_OK


def run_resume(args: argparse.Namespace, ctx: Context) -> int:
    seed_id, by = _checked(args)
    woken = seed_control.release(ctx.client, ctx.keys, seed_id, by)
    if ctx.json:
        ctx.emit_json({"seed_id": seed_id, "was_held": woken is not None, "woken": woken or 0})
    elif woken is None:
        ctx.say(f"seed {seed_id} was not held")
    else:
        ctx.say(f"seed {seed_id} resumed: {woken} parked task(s) due now")
    return EXIT_OK if woken is not None else EXIT_INCOMPLETE


def run_cancel(args: argparse.Namespace, ctx: Context) -> int:
    seed_id, by = _checked(args)
    removed = seed_control.cancel(ctx.client, ctx.keys, seed_id, by)
    if ctx.json:
        ctx.emit_json({"seed_id": seed_id, "cancelled": True, "removed": removed})
    else:
        ctx.say(f"seed {seed_id} cancelled: {removed['waiting']} waiting and "
                f"{removed['delayed']} delayed task(s) removed; tasks in flight finish")
    return EXIT_OK



def run_controls(args: argparse.Namespace, ctx: Context) -> int:
    found = seed_control.controls(ctx.client, ctx.keys)
    if ctx.json:
        ctx.emit_json(found)
        return EXIT_OK
    if not found:
        ctx.say("no seed was paused or cancelled")
        return EXIT_OK
    rows = [{"seed": seed, "held": "yes" if r.get("held") else "",
             "cancelled": "yes" if r.get("cancelled") else "", "last": r.get("state", ""),
             "by": r.get("by", ""), "at": utc_time(r.get("at"), ""), "reason": r.get("reason", "")}
            for seed, r in sorted(found.items())]
    for line in table(rows, ["seed", "held", "cancelled", "last", "by", "at", "reason"]):
        ctx.say(line)
    return EXIT_OK

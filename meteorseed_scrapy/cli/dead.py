"""``meteorseed dead list|show|requeue|purge``: inspect and act on the dead-letter stream."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from meteorseed_scrapy.cli.common import (
    CliError,
    Context,
    add_target_options,
    dedup_keys,
    printable,
    project_fingerprinter,
    table,
)
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.queue.consume import deadletters
from meteorseed_scrapy.validators import ConfigError, format_duration, parse_duration


def register(sub: Any) -> None:
    dead = sub.add_parser("dead", help="dead letters: list, show, requeue, purge")
    actions = dead.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = actions.add_parser("list", help="list dead letters, oldest first")
    add_target_options(p)
    p.add_argument("--limit", type=int, default=50, help="at most N entries (default 50)")
    p.add_argument("--site", help="only dead letters of this site_id")
    p.set_defaults(run=run_list)

    p = actions.add_parser("show", help="one dead letter in full")
    add_target_options(p)
    p.add_argument("id", help="dead-letter id (from `dead list` or the worker's log line), or "
                              "the task id or task message id it was dead-lettered under")
    p.set_defaults(run=run_show)

    p = actions.add_parser(
        "requeue", help="put tasks back on their lanes' task streams, bypassing dedup, and drop "
        "their dead letters")
    add_target_options(p)
    _add_selection(p)
    p.add_argument("--site", help="with --all: only dead letters of this site_id")
    p.set_defaults(run=run_requeue)

    p = actions.add_parser("purge", help="delete dead letters for good")
    add_target_options(p)
    _add_selection(p)
    p.add_argument("--older-than", metavar="AGE", help="instead of IDs or --all: every dead "
                   "letter older than AGE (seconds, or 45s, 30m, 2h, 7d, 2w, 1d12h)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(run=run_purge)


def _add_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="*", metavar="ID", help="dead-letter ids")
    parser.add_argument("--all", action="store_true", help="every dead letter")


def _dead_name(ctx: Context) -> str:
    deads = ctx.keys.deads
    return deads[0] if len(deads) == 1 else f"{len(deads)} dead-letter streams ({deads[0]}, ...)"


def _selection(args: argparse.Namespace) -> list[str]:
    if bool(args.ids) == bool(args.all):
        raise CliError("give dead-letter IDs or --all (not both)")
    bad = [i for i in args.ids if not deadletters.LETTER_ID.match(i)]
    if bad:
        raise CliError(f"not a dead-letter id: {bad[0]!r} "
                       f"(expected {deadletters.LETTER_ID_FORM})")
    return list(dict.fromkeys(args.ids))


def run_list(args: argparse.Namespace, ctx: Context) -> int:
    if args.limit < 1:
        raise CliError("--limit must be at least 1")
    rows = []
    for letter in deadletters.iter_dead(ctx.client, ctx.keys, site=args.site):
        rows.append(letter.summary())
        if len(rows) == args.limit:
            break
    if ctx.json:
        ctx.emit_json(rows)
    elif rows:
        columns = ("id", "site_id", "url", "deliveries", "at", "reason")
        ctx.say("\n".join(table(rows, columns)))
    else:
        ctx.say("no dead letters" + (f" for site {args.site}" if args.site else ""))
    return EXIT_OK


#: A task id as ``new_task_id`` makes them (uuid4 hex).
TASK_ID = re.compile(r"^[0-9a-f]{32}$")


def run_show(args: argparse.Namespace, ctx: Context) -> int:
    letter = _find(ctx, args.id)
    shown = letter.summary()
    shown["task"] = letter.task.to_dict() if letter.task else None
    shown["payload"] = letter.fields.get("t", "")
    if ctx.json:
        ctx.emit_json(shown)
        return EXIT_OK
    for name in ("id", "site_id", "spider", "task_id", "seed_id", "url", "consumer", "deliveries",
                 "at", "source_id", "requeueable", "error"):
        if shown.get(name) is not None:
            ctx.say(f"{name + ':':<13}{printable(str(shown[name]))}")
    ctx.say("reason:")  # (a traceback: its lines stay lines)
    ctx.say("  " + printable(shown["reason"], newlines=True).replace("\n", "\n  "))
    ctx.say("task:" if letter.task else "payload:")
    body = shown["task"] if letter.task else shown["payload"]
    ctx.say(json.dumps(body, indent=2, ensure_ascii=False) if letter.task
            else printable(str(body)))
    return EXIT_OK


def _find(ctx: Context, wanted: str) -> deadletters.DeadLetter:
    """The dead letter ``wanted`` names: its own id, else the task id or the task message id
    (``source_id``) it was dead-lettered under (a scan of the dead letters)."""
    is_letter = bool(deadletters.LETTER_ID.match(wanted))
    if is_letter:
        found, _missing = deadletters.fetch(ctx.client, ctx.keys, [wanted])
        if found:
            return found[0]
    elif not TASK_ID.match(wanted):
        raise CliError(f"not a dead-letter id, task id or message id: {wanted!r} "
                       f"(expected {deadletters.LETTER_ID_FORM}, or 32 hex digits)")
    for letter in deadletters.iter_dead(ctx.client, ctx.keys):
        if letter.fields.get("source_id") == wanted or (
                letter.task is not None and letter.task.task_id == wanted):
            return letter
    raise CliError(f"no dead letter {wanted} in {_dead_name(ctx)}"
                   + ("" if is_letter else " (by task id)"), EXIT_INCOMPLETE)


def run_requeue(args: argparse.Namespace, ctx: Context) -> int:
    ids = _selection(args)
    if args.site and not args.all:
        raise CliError("--site goes with --all")
    result = deadletters.RequeueResult()
    # Each requeued URL is recorded in its site's dedup set: keyed as the project's workers key
    # it, else a seed would enqueue it again.
    fingerprinter = project_fingerprinter(ctx)
    if args.all:
        upto = deadletters.last_id(ctx.client, ctx.keys)
        batch: list[deadletters.DeadLetter] = []
        for letter in deadletters.iter_dead(ctx.client, ctx.keys, upto=upto, site=args.site):
            batch.append(letter)
            if len(batch) == deadletters.BATCH:
                deadletters.requeue(ctx.client, ctx.keys, batch, result,
                                    fingerprinter=fingerprinter)
                batch = []
        deadletters.requeue(ctx.client, ctx.keys, batch, result, fingerprinter=fingerprinter)
    else:
        found, result.missing = deadletters.fetch(ctx.client, ctx.keys, ids)
        deadletters.requeue(ctx.client, ctx.keys, found, result, fingerprinter=fingerprinter)
    if ctx.json:
        ctx.emit_json({"requeued": result.requeued, "kept": result.kept,
                       "missing": result.missing, "dedup_keys": dedup_keys(fingerprinter)})
    else:
        for kept in result.kept:
            ctx.warn(f"cannot requeue {kept['id']}: {printable(str(kept['error']))}; kept in "
                     f"{_dead_name(ctx)}")
        for missing in result.missing:
            ctx.warn(f"no dead letter {missing}")
        ctx.say(f"requeued {len(result.requeued)} tasks onto their lanes' task streams"
                f"; kept {len(result.kept)}; not found {len(result.missing)}"
                f"; dedup keys: {dedup_keys(fingerprinter)}")
    return EXIT_INCOMPLETE if result.kept or result.missing else EXIT_OK


def run_purge(args: argparse.Namespace, ctx: Context) -> int:
    if args.older_than is not None:
        return _purge_older(args, ctx)
    ids = _selection(args)
    if args.all:
        upto = deadletters.last_id(ctx.client, ctx.keys)
        ids = [d.id for d in deadletters.iter_dead(ctx.client, ctx.keys, upto=upto)]
    if not ids:
        deleted = 0
    elif ctx.confirm(f"delete {len(ids)} dead letters from {_dead_name(ctx)}?", args.yes):
        deleted = deadletters.purge(ctx.client, ctx.keys, ids)
    else:
        ctx.warn("nothing deleted")
        return EXIT_INCOMPLETE
    if ctx.json:
        ctx.emit_json({"purged": deleted, "not_found": len(ids) - deleted})
    else:
        ctx.say(f"purged {deleted} dead letters" +
                (f"; {len(ids) - deleted} not found" if len(ids) > deleted else ""))
    return EXIT_OK if deleted == len(ids) else EXIT_INCOMPLETE


def _purge_older(args: argparse.Namespace, ctx: Context) -> int:
    if args.ids or args.all:
        raise CliError("give dead-letter IDs, --all or --older-than (one of them)")
    try:
        age = parse_duration(args.older_than, "--older-than", positive=True)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if not ctx.confirm(f"delete every dead letter older than {format_duration(age)} from "
                       f"{_dead_name(ctx)}?", args.yes):
        ctx.warn("nothing deleted")
        return EXIT_INCOMPLETE
    deleted = deadletters.purge_older(ctx.client, ctx.keys, age)
    if ctx.json:
        ctx.emit_json({"purged": deleted})
    else:
        ctx.say(f"purged {deleted} dead letters older than {format_duration(age)}")
    return EXIT_OK

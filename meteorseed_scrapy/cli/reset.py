"""``meteorseed reset``: delete every key of a namespace (tasks, dead letters, dedup, notes)."""

from __future__ import annotations

import argparse
from typing import Any

from meteorseed_scrapy.cli.common import Context, add_target_options
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.queue.scan import scan_namespace

#: Keys per UNLINK: UNLINK frees memory in the background, the batch only bounds one command.
BATCH = 500


def register(sub: Any) -> None:
    parser = sub.add_parser("reset", help="delete every key of the namespace")
    add_target_options(parser)
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(run=run)


def delete_namespace(ctx: Context) -> int:
    """SCAN ``<ns>:*`` and UNLINK in batches; returns how many keys were deleted."""
    deleted = 0
    batch: list[str] = []
    for key in scan_namespace(ctx.client, ctx.keys):
        batch.append(key)
        if len(batch) == BATCH:
            deleted += int(ctx.client.unlink(*batch))
            batch = []
    if batch:
        deleted += int(ctx.client.unlink(*batch))
    return deleted


def run(args: argparse.Namespace, ctx: Context) -> int:
    # Count first, so the question says what is at stake (and an empty namespace asks nothing).
    count = sum(1 for _ in scan_namespace(ctx.client, ctx.keys))
    if count and not ctx.confirm(
        f"delete all {count} keys of namespace {ctx.keys.namespace!r} at {ctx.url}?", args.yes
    ):
        ctx.warn("nothing deleted")
        return EXIT_INCOMPLETE
    deleted = delete_namespace(ctx) if count else 0
    if ctx.json:
        ctx.emit_json({"namespace": ctx.keys.namespace, "deleted": deleted})
    else:
        ctx.say(f"deleted {deleted} keys of namespace {ctx.keys.namespace!r}")
    return EXIT_OK

"""``meteorseed reset``: delete every key of a namespace (tasks, dead letters, dedup, notes).

Only the namespace's own keys (:func:`~meteorseed_scrapy.queue.keys.own_key`): keys under
``<ns>:`` that belong to a namespace nested in it (``prod:eu:…`` under ``prod``, which older
versions allowed) are counted, shown and kept."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from meteorseed_scrapy.cli.common import Context, add_target_options
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.queue.keys import own_key
from meteorseed_scrapy.queue.scan import scan_namespace, scan_prefix

#: Keys per UNLINK: UNLINK frees memory in the background, the batch only bounds one command.
BATCH = 500


def register(sub: Any) -> None:
    parser = sub.add_parser("reset", help="delete every key of the namespace")
    add_target_options(parser)
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(run=run)


def delete_namespace(ctx: Context) -> int:
    """SCAN ``<ns>:*`` and UNLINK the namespace's own keys in batches; how many were deleted."""
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


def census(ctx: Context) -> tuple[int, Counter[str]]:
    """How many keys are the namespace's own, and how many under its prefix belong to each
    namespace nested in it (``<ns>:<part>``)."""
    ns = ctx.keys.namespace
    own, nested = 0, Counter[str]()
    for key in scan_prefix(ctx.client, ctx.keys):
        if own_key(ns, key):
            own += 1
        else:
            nested[f"{ns}:{key[len(ns) + 1:].split(':', 1)[0]}"] += 1
    return own, nested


def run(args: argparse.Namespace, ctx: Context) -> int:
    # Count first, so the question says what is at stake (and an empty namespace asks nothing).
    ns = ctx.keys.namespace
    count, nested = census(ctx)
    kept = ", ".join(f"{name!r} ({n} keys)" for name, n in sorted(nested.items()))
    if nested:
        ctx.warn(f"keys under {ns + ':'!r} of other namespaces are kept: {kept}")
    if count and not ctx.confirm(
        f"delete all {count} keys of namespace {ns!r} at {ctx.url}?", args.yes
    ):
        ctx.warn("nothing deleted")
        return EXIT_INCOMPLETE
    deleted = delete_namespace(ctx) if count else 0
    if ctx.json:
        out: dict[str, Any] = {"namespace": ns, "deleted": deleted}
        if nested:
            out["kept"] = dict(sorted(nested.items()))
        ctx.emit_json(out)
    else:
        ctx.say(f"deleted {deleted} keys of namespace {ns!r}"
                + (f"; kept those of {kept}" if nested else ""))
    return EXIT_OK

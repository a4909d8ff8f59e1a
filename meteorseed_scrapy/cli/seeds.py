"""``meteorseed seeds list | show ID | items ID``: a crawl as a whole, seed by seed (``pause``,
``resume``, ``cancel`` and ``controls``: :mod:`.seed_control`).

``list`` and ``show`` print each seed's progress
(:mod:`meteorseed_scrapy.queue.fleet.crawl_progress`:
what became of its tasks, counted fleet-wide as they settle) with its site and registry status;
``items`` prints a seed's stored items as JSON Lines, read from the store page by page
(``Store.seed_items_page``: ``_id`` order, a stable cursor).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from meteorseed_scrapy.cli.common import (
    CliError,
    Context,
    add_target_options,
    cli_settings,
    resolve_target,
    table,
    utc_time,
)
from meteorseed_scrapy.cli.seed_control import register as register_control
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.queue.consume.seed_control import control_of, controls, shown_state
from meteorseed_scrapy.queue.fleet.crawl_progress import COUNTERS, read_progress_sync
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.seeding.records import SeedRecord
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.settings import store_uri_from

#: Most seeds ``list`` shows.
LIST_LIMIT = 1000
#: Items read from the store per page by ``items``.
ITEMS_PAGE = 500
#: The columns of ``list`` and ``show``, in order.
COLUMNS = ("seed", "site", "state", *COUNTERS, "started", "finished")


def register(sub: Any) -> None:
    seeds = sub.add_parser("seeds", help="seeds as crawls: their progress, end and items")
    actions = seeds.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser("list", help="registered seeds with their progress")
    p.add_argument("--site", help="only this site's seeds")
    add_target_options(p)
    p.set_defaults(run=run_list)
    p = actions.add_parser("show", help="one seed's progress: counters, finished and when")
    p.add_argument("seed_id", metavar="ID")
    add_target_options(p)
    p.set_defaults(run=run_show)
    p = actions.add_parser("items", help="a seed's stored items, as JSON Lines")
    p.add_argument("seed_id", metavar="ID")
    p.add_argument("--jsonl", action="store_true", help="JSON Lines (the one format)")
    p.add_argument("--limit", type=int, metavar="N", help="at most N items")
    p.add_argument("--store-uri", help="the store (default: METEORSEED_STORE_URI)")
    add_target_options(p)
    p.set_defaults(run=run_items)
    register_control(actions)



def _records(args: argparse.Namespace, ctx: Context, seed_id: str | None = None
             ) -> list[SeedRecord]:
    url, _ = resolve_target(args.redis_url, args.namespace)

    async def fetch() -> list[SeedRecord]:
        client = async_client(url, socket_connect_timeout=5, socket_timeout=30)
        try:
            registry = SeedRegistry(client, ctx.keys)
            if seed_id is not None:
                record = await registry.get(seed_id)
                return [record] if record is not None else []
            return await registry.list(site_id=args.site, limit=LIST_LIMIT)
        finally:
            await client.aclose()

    return asyncio.run(fetch())


def row(seed_id: str, record: SeedRecord | None, progress: dict[str, Any] | None,
        control: dict[str, Any] | None = None) -> dict[str, Any]:
    """One seed as ``list`` and ``show`` print it (its state ``paused`` or ``cancelled`` while
    an operator's control lasts: :func:`shown_state`)."""
    shown: dict[str, Any] = {
        "seed": seed_id, "site": record.seed.site_id if record is not None else None,
        "state": shown_state(progress["state"] if progress is not None else "not counted",
                             control),
    }
    for name in COUNTERS:
        shown[name] = progress[name] if progress is not None else None
    shown["started"] = progress["started_at"] if progress is not None else None
    shown["finished"] = progress["finished_at"] if progress is not None else None
    return shown


def _json(seed_id: str, record: SeedRecord | None, progress: dict[str, Any] | None,
          control: dict[str, Any] | None) -> dict[str, Any]:
    return {"seed_id": seed_id, "site_id": record.seed.site_id if record else None,
            "status": record.status if record else None, "progress": progress,
            "control": control}


_FORMATS = {"started": utc_time, "finished": utc_time}


def run_list(args: argparse.Namespace, ctx: Context) -> int:
    records = _records(args, ctx)
    progress = read_progress_sync(ctx.client, ctx.keys, [r.seed_id for r in records])
    found = controls(ctx.client, ctx.keys)
    if ctx.json:
        ctx.emit_json([_json(r.seed_id, r, progress[r.seed_id], found.get(r.seed_id))
                       for r in records])
        return EXIT_OK
    if not records:
        ctx.say("no seeds registered")
        return EXIT_OK
    rows = [row(r.seed_id, r, progress[r.seed_id], found.get(r.seed_id)) for r in records]
    ctx.say("\n".join(table(rows, COLUMNS, _FORMATS)))
    if len(records) == LIST_LIMIT:
        ctx.say(f"(first {LIST_LIMIT} seeds only)")
    return EXIT_OK


def run_show(args: argparse.Namespace, ctx: Context) -> int:
    seed_id = args.seed_id
    records = _records(args, ctx, seed_id)
    record = records[0] if records else None
    progress = read_progress_sync(ctx.client, ctx.keys, [seed_id])[seed_id]
    control = control_of(ctx.client, ctx.keys, seed_id)
    if record is None and progress is None and control is None:
        raise CliError(f"no seed {seed_id!r} (not registered, nothing of it counted)",
                       EXIT_INCOMPLETE)
    if ctx.json:
        ctx.emit_json(_json(seed_id, record, progress, control))
        return EXIT_OK
    shown = row(seed_id, record, progress, control)
    for name in COLUMNS:
        value = shown[name]
        ctx.say(f"{name + ':':<11} {_FORMATS[name](value) if name in _FORMATS else value}")
    if progress is not None:
        ctx.say(f"{'run:':<11} {progress['run']}")
        if progress["previous"]:
            last = progress["previous"]
            ctx.say(f"{'last run:':<11} " + ", ".join(
                f"{name} {last.get(name, 0)}" for name in ("enqueued", "done", "dead", "items")))
    if control is not None:
        now = "cancelled" if control["cancelled"] else "paused" if control["held"] else "free"
        ctx.say(f"{'control:':<11} {now}; last {control.get('state', '?')} by "
                f"{control.get('by', '?')} at {utc_time(control.get('at'))}")
    return EXIT_OK


def run_items(args: argparse.Namespace, ctx: Context) -> int:
    from meteorseed_scrapy.store.backends import open_store  # (its drivers: lazily)

    uri = args.store_uri or store_uri_from(cli_settings())
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be at least 1")
    left = args.limit
    after: str | None = None
    with open_store(uri, ctx.keys.namespace, None) as store:
        while left is None or left > 0:
            size = ITEMS_PAGE if left is None else min(ITEMS_PAGE, left)
            page = store.seed_items_page(args.seed_id, after, size)
            for doc in page:
                ctx.out.write(json.dumps(doc, ensure_ascii=False, default=str) + "\n")
            if len(page) < size:
                break
            after = page[-1]["_id"]
            left = None if left is None else left - len(page)
    return EXIT_OK

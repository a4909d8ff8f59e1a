"""``meteorseed task URL|ID``: where one task is and since when (waiting, pending, delayed,
done, dead, deduplicated) and what became of its URL when a task of it last ended (done with
its items, gone, robots, blacklisted, dead, cancelled: the site's task history), read by
:mod:`meteorseed_scrapy.queue.inspect.task_state`, the reader the
API's ``GET /tasks`` and the console share."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any

from meteorseed_scrapy.cli.common import (
    CliError,
    Context,
    add_target_options,
    printable,
    project_fingerprinter,
)
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.queue.inspect.task_query import Place, TaskState, parse_query
from meteorseed_scrapy.queue.inspect.task_state import task_state_plan
from meteorseed_scrapy.queue.plumbing.reads import run_sync
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.validators import format_duration


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "task", help="where is a task: waiting, pending, delayed, done, dead or deduplicated, "
        "and what became of its URL (task history)",
        description="Look a task up by its task id, or by URL (canonicalised and fingerprinted "
        "as the writer does). Exit code 1 when it is found nowhere searched.")
    add_target_options(parser)
    parser.add_argument("target", metavar="URL|ID", help="a task id or an http(s) URL")
    parser.add_argument("--site", help="the URL's site_id (its dedup record; else the sites of "
                        "the entries found and of the seed registry are tried)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, ctx: Context) -> int:
    fingerprinter = project_fingerprinter(ctx) if "://" in args.target else None
    try:
        query = parse_query(args.target, site=args.site, fingerprinter=fingerprinter)
    except TaskError as exc:
        name = "--site" if exc.field == "site_id" else exc.field
        raise CliError(f"argument {name}: {exc.problem}") from None
    state = run_sync(ctx.client, task_state_plan(ctx.keys, query))
    if ctx.json:
        ctx.emit_json(state.to_json())
    else:
        for line in describe(state):
            ctx.say(line)
    return EXIT_INCOMPLETE if state.state == "not found" else EXIT_OK


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "never"
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds")


def _ago(stamp: float, now: float) -> str:
    seconds = now - stamp
    if seconds >= 0:
        return f"{format_duration(round(seconds))} ago"
    return f"in {format_duration(round(-seconds))}"


def _place(place: dict[str, Any], now: float) -> str:
    kind = place["state"]
    if kind in (Place.WAITING, Place.PENDING):
        where = f"{place['lane']}/{place['band']} ({place['stream']}, entry {place['entry_id']})"
        head = f"{kind} in {where}, enqueued {_ago(place['enqueued_at'], now)}"
        if kind == Place.WAITING:
            return f"{head}; {place['ahead']} ahead of it"
        if "consumer" in place:
            return (f"{head}; on consumer {place['consumer']} for "
                    f"{format_duration(round(place['idle_s']))}, "
                    f"delivered {place['deliveries']} time(s)")
        return head
    if kind == Place.DELAYED:
        due = place["due_at"]
        when = "never due" if due is None else f"due {_when(due)} ({_ago(due, now)})"
        return (f"delayed ({place['why']}) in {place['key']}, {when}, then to "
                f"{place['to_lane']}/{place['to_band']}")
    if kind == Place.DEAD:
        return (f"dead letter {place['id']} at {place['at']}: {place['reason']} "
                f"(consumer {place['consumer']}, {place['deliveries']} deliveries)")
    if kind == Place.DONE:
        record = place.get("record") or {}
        parts = [f"{k} {record[k]}" for k in ("outcome", "reason", "items", "status", "digest")
                 if k in record]
        at = record.get("at")
        if isinstance(at, (int, float)) and not isinstance(at, bool):
            parts.append(f"at {_when(at)}")
        return f"done ({', '.join(parts) or place.get('note') or 'record unreadable'})"
    return kind


#: How each task history outcome reads.
ENDED = {"done": "done", "gone": "gone (not found)", "robots": "not fetched: robots.txt",
         "blacklisted": "not fetched: the site's blacklist", "ignored": "ignored",
         "dead": "dead-lettered", "cancelled": "cancelled"}


def _ended(row: dict[str, Any], now: float) -> str:
    """A task history record as a line: what, when, by whom."""
    what = ENDED.get(row["outcome"], row["outcome"])
    details = []
    if row["outcome"] == "done":
        details.append(f"{row['items']} item(s)")
    if row.get("status"):
        details.append(f"HTTP {row['status']}")
    if row.get("reason"):
        details.append(str(row["reason"]))
    head = f"{what} ({', '.join(details)})" if details else what
    by = f" by consumer {row['consumer']}" if row.get("consumer") else ""
    return (f"{head} at {_when(row['at'])} ({_ago(row['at'], now)}){by} "
            f"[site {row['site_id']}'s task history]")


def describe(state: TaskState, now: float | None = None) -> list[str]:
    """The answer as lines for a terminal (stored text escaped)."""
    now = state.at if now is None else now
    query = state.query.to_json()
    lines = [f"{name + ':':<15}{value}" for name, value in query.items() if value is not None]
    lines.append(f"{'state:':<15}{state.state}")
    task = next((p["task"] for p in state.places if p.get("task")), None)
    if task is not None:
        lines.append(f"{'task:':<15}{task['task_id']} (site {task['site_id']}, seed "
                     f"{task['seed_id']}) {task['url']}")
    lines += [f"  - {_place(place, now)}" for place in state.places]
    lines += [f"  - {_ended(row, now)}" for row in state.history]
    for row in state.dedup:
        if not row["seen"]:
            lines.append(f"  - not in site {row['site_id']}'s dedup record: a seed may "
                         "enqueue it")
        elif row["window_s"]:
            lines.append(f"  - deduplicated by site {row['site_id']} (window "
                         f"{format_duration(row['window_s'])}): seen since about "
                         f"{_when(row['seen_from'])}, eligible again {_when(row['eligible_at'])}"
                         f" ({_ago(row['eligible_at'], now)})")
        else:
            lines.append(f"  - deduplicated by site {row['site_id']}: never re-crawled "
                         "(no re-crawl window) unless dead-lettered or released")
    if state.last_failure:
        lines.append(f"{'last failure:':<15}{state.last_failure}")
    read = sum(s.read for s in state.searched)
    lines.append(f"{'searched:':<15}{len(state.searched)} keys, {read} entries read"
                 + (", every one in full" if state.exhaustive else ""))
    # (--json lists every search; here only the ones cut short, where "absent" is no proof)
    lines += [f"  not in full: {s.where}: {s.how}: {s.read} read"
              for s in state.searched if not s.complete]
    lines += [f"note: {note}" for note in state.notes]
    return [printable(line) for line in lines]


__all__ = ["describe", "register", "run"]


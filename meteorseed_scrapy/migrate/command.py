"""``scrapy seed-expand --from-scrapy-redis SPIDER``: the command-line side of the migration."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from meteorseed_scrapy.exit_codes import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.migrate.convert import Origin
from meteorseed_scrapy.migrate.scrapy_redis import (
    MigrationSummary,
    RefusedEntry,
    ScrapyRedisSource,
    migrate,
)
from meteorseed_scrapy.queue.enqueue.dedup import settings_fingerprinter
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN, async_client
from meteorseed_scrapy.task.validation import TaskError, check_spider
from meteorseed_scrapy.task.validation import check_id as _check_id

if TYPE_CHECKING:
    from scrapy.settings import Settings

DEFAULT_SEED_ID = "scrapy-redis"


def add_options(group: Any) -> None:
    """The migration's options. ``--dry-run`` is seed-expand's own (one option for both
    modes: declared twice, the later one took the name and refused a plain seed file's)."""
    group.add_argument(
        "--from-scrapy-redis", metavar="SPIDER",
        help="instead of reading seeds, migrate the waiting requests and start URLs of this "
             "scrapy-redis spider (keys from SCHEDULER_QUEUE_KEY / REDIS_START_URLS_KEY)",
    )
    group.add_argument("--move", action="store_true",
                       help="with --from-scrapy-redis: remove each migrated entry from the "
                            "scrapy-redis keys once its task is on the stream")
    group.add_argument("--site-id", metavar="ID",
                       help="with --from-scrapy-redis: site_id of the tasks (default: SPIDER)")
    group.add_argument("--seed-id", metavar="ID",
                       help="with --from-scrapy-redis: seed_id of the tasks "
                            f"(default: {DEFAULT_SEED_ID})")


def check_options(args: list[str], opts: argparse.Namespace) -> str | None:
    """A usage problem of the migration options, or None."""
    if not opts.from_scrapy_redis:
        used = [o for o in ("move", "site_id", "seed_id") if getattr(opts, o)]
        return f"--{used[0].replace('_', '-')} needs --from-scrapy-redis" if used else None
    if args:
        return "--from-scrapy-redis reads Redis, not a FILE: drop the FILE argument"
    if opts.move and opts.dry_run:
        return "--move and --dry-run exclude each other"
    try:
        _check_id("site_id", opts.site_id or opts.from_scrapy_redis)
        _check_id("seed_id", opts.seed_id or DEFAULT_SEED_ID)
    except TaskError as exc:
        return str(exc)
    return None


def _say(message: str) -> None:
    print(f"seed-expand: {message}", file=sys.stderr, flush=True)


def _set_name(spider: str) -> str | None:
    """The spider's task set, when its name can name one (else any worker's)."""
    try:
        return check_spider(spider)
    except TaskError:
        return None


def run_migration(settings: Settings, redis_url: str, keys: KeyLayout, opts: argparse.Namespace,
                  max_backlog: int, redact: Any) -> int:
    """Run it, print the summary; returns the exit code."""
    spider = opts.from_scrapy_redis
    source = ScrapyRedisSource.from_settings(settings, spider)
    origin = Origin(site_id=opts.site_id or spider, seed_id=opts.seed_id or DEFAULT_SEED_ID,
                    spider=_set_name(spider))
    summary: list[MigrationSummary] = []
    try:  # the migrated URLs are keyed as the project's workers key their dedup records
        fingerprinter = settings_fingerprinter(settings)
    except Exception as exc:  # the project's class: not importable, or failing to build
        _say(f"REQUEST_FINGERPRINTER_CLASS: {str(exc)[:200]}")
        return EXIT_ERROR
    if fingerprinter is not None:
        _say(f"dedup keys from REQUEST_FINGERPRINTER_CLASS {type(fingerprinter).__name__}")

    def on_reject(rejection: RefusedEntry) -> None:
        print(rejection, file=sys.stderr, flush=True)

    async def main() -> None:
        # Bytes replies: queue entries are pickles, not text.
        client = async_client(
            redis_url, socket_connect_timeout=10, socket_timeout=60, decode_responses=False
        )
        try:
            await client.ping()
            summary.append(await migrate(
                client, TaskWriter(client, keys, fingerprinter=fingerprinter), source, origin,
                move=opts.move, dry_run=opts.dry_run, batch_size=opts.batch_size,
                on_reject=on_reject, max_backlog=max_backlog,
                on_wait=lambda n: _say(f"{n} tasks waiting (more than {max_backlog}); "
                                       "pausing until workers catch up"),
            ))
        finally:
            await client.aclose()

    try:
        asyncio.run(main())
    except REDIS_DOWN as exc:
        _say(f"cannot reach Redis at {redact(redis_url)}: {exc}")
        return EXIT_ERROR
    except RedisError as exc:
        _say(f"Redis error at {redact(redis_url)}: {exc}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        _say("interrupted; re-running skips what is already on the stream")
        return 130
    if not summary[0].requests and not summary[0].start_urls:
        _say(f"nothing found under {source.queue_key} or {source.start_urls_key}")
    print(summary[0], flush=True)
    return EXIT_INCOMPLETE if summary[0].rejected else EXIT_OK

"""``scrapy seed-expand FILE|-``: expand JSON Lines seeds into exec tasks in the Redis stream.

Registered through the ``scrapy.commands`` entry point, so it works inside any Scrapy project
(reading its settings) and outside one (Scrapy's defaults plus ``-s``). It needs no crawler and
no reactor: its Redis work runs in a plain ``asyncio.run``.
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

# Scrapy imports every entry-point command on each run (`scrapy list` too): this module imports
# only Scrapy's own command base at load time; Redis, asyncio and the seeding machinery are
# imported inside the methods that use them (tests/test_command_imports.py keeps it so).
if TYPE_CHECKING:
    import argparse

    from meteorseed_scrapy.queue.keys import KeyLayout
    from meteorseed_scrapy.seeding.expand import ExpandSummary, Rejection

__all__ = ["Command"]

EXIT_REJECTED = 1
EXIT_FAILED = 2


def _say(message: str) -> None:
    print(f"seed-expand: {message}", file=sys.stderr, flush=True)


class Command(ScrapyCommand):
    requires_project = False
    # No crawler, hence no reactor: the command only talks to Redis.
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "[options] FILE|-  |  --watch [FILE|-]"

    def short_desc(self) -> str:
        return "Expand JSON Lines seeds into exec tasks in the Redis task stream"

    def long_desc(self) -> str:
        from meteorseed_scrapy.seeding.payload import MAX_URLS_PER_LINE
        from meteorseed_scrapy.seeding.seed_lines import MAX_LINE_BYTES

        return (
            "Read seeds, one JSON object per line, from FILE (or stdin for -), expand each into "
            "exec tasks and enqueue them in the Redis task stream, skipping URLs the site has "
            "already seen. A line may hold up to "
            f"{MAX_LINE_BYTES // (1024 * 1024)} MiB and {MAX_URLS_PER_LINE} URLs. A bad line is "
            "reported on stderr as 'line N: reason', a bad URL in a good line as "
            "'line N, url M: reason', where N counts lines from 1 and M is the 0-based index of "
            "the URL in payload.urls; everything else is still enqueued. The last stdout line "
            "reads 'read N lines, enqueued E, duplicates D, rejected R'. Exit code: 0 when "
            f"nothing was rejected, {EXIT_REJECTED} when something was, {EXIT_FAILED} when Redis "
            "or the input failed. While more than METEORSEED_MAX_BACKLOG tasks wait in the "
            "stream, the command pauses until workers catch up. Settings: METEORSEED_REDIS_URL, "
            "METEORSEED_NAMESPACE, METEORSEED_MAX_BACKLOG (use -s NAME=VALUE). Each seed is "
            "registered in the seed registry with this run's counts (not with --no-register). "
            "With --watch it "
            "keeps running as a seeder: seeds are registered in the seed registry and expanded "
            "again whenever their schedule makes them due (METEORSEED_SCHEDULE_MIN_INTERVAL, "
            "METEORSEED_SCHEDULE_MAX_INTERVAL, METEORSEED_SITES_DIR; see docs/seeding.md)."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        from meteorseed_scrapy.migrate import command as migration
        from meteorseed_scrapy.task.lanes import DEFAULT_LANE, LANES

        super().add_options(parser)
        group = parser.add_argument_group(title="seed-expand options")
        group.add_argument(
            "--batch-size", type=int, default=500, metavar="N",
            help="tasks per Redis round trip (default: 500)",
        )
        group.add_argument(
            "--no-dedup", action="store_true",
            help="enqueue every URL, even one its site has already seen",
        )
        group.add_argument(
            "--dry-run", action="store_true",
            help="expand, validate and count the URLs; enqueue nothing (Redis is not used)",
        )
        group.add_argument(
            "--no-register", action="store_true",
            help="do not register the seeds in the seed registry (by default each is, with "
            "this run's counts, so that GET /seeds and the console list it)",
        )
        group.add_argument(
            "--watch", action="store_true",
            help="keep running: register FILE's seeds (if given; again when it changes) in the "
            "seed registry and re-expand every seed when due (its schedule); stop with SIGTERM",
        )
        group.add_argument(
            "--lane", choices=LANES, default=None,
            help="put every task of this run in this lane (default: each seed's 'lane' field, "
            f"else {DEFAULT_LANE}); realtime tasks are read first",
        )
        migration.add_options(group)

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        from meteorseed_scrapy.migrate import command as migration

        super().process_options(args, opts)
        if opts.batch_size < 1:
            raise UsageError("--batch-size must be at least 1", print_help=False)
        if opts.lane and opts.watch:
            raise UsageError("--lane does not go with --watch: give the seeds a 'lane' field",
                             print_help=False)
        problem = migration.check_options(args, opts)
        if problem:
            raise UsageError(problem, print_help=False)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        import asyncio
        from contextlib import ExitStack

        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        from meteorseed_scrapy.queue.keys import KeyLayout
        from meteorseed_scrapy.queue.shards import ShardMismatch
        from meteorseed_scrapy.scrapy_redis_settings import redact
        from meteorseed_scrapy.seeding.expand import ExpandSummary
        from meteorseed_scrapy.settings import redis_url_from
        from meteorseed_scrapy.validators import ConfigError

        assert self.settings is not None
        # Scrapy parses with parse_known_args: a mistyped option lands in args.
        unknown = [arg for arg in args if arg.startswith("-") and arg != "-"]
        if unknown:
            raise UsageError(f"unknown option {unknown[0]}", print_help=False)
        if opts.from_scrapy_redis:
            self._migrate(opts)
            return
        if opts.watch:
            self.exitcode = self._watch(args, opts)
            return
        if len(args) != 1:
            raise UsageError("expected exactly one FILE argument (- reads stdin)")
        redis_url = redis_url_from(self.settings)
        try:
            keys = KeyLayout.from_settings(self.settings)
        except ConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None
        max_backlog = self._max_backlog()

        with ExitStack() as stack:
            try:
                source: IO[bytes] = (
                    sys.stdin.buffer if args[0] == "-" else stack.enter_context(open(args[0], "rb"))
                )
            except OSError as exc:
                _say(f"cannot read {args[0]}: {exc.strerror or exc}")
                self.exitcode = EXIT_FAILED
                return
            summary = ExpandSummary()
            code = EXIT_FAILED
            try:
                asyncio.run(self._expand(source, redis_url, keys, opts, max_backlog, summary))
                failure = ""
            except (RedisConnectionError, RedisTimeoutError) as exc:
                failure = f"cannot reach Redis at {redact(redis_url)}: {exc}"
            except ShardMismatch as exc:
                failure = str(exc)
            except RedisError as exc:
                failure = f"Redis error at {redact(redis_url)}: {exc}"
            except OSError as exc:
                failure = f"cannot read {args[0]}: {exc.strerror or exc}"
            except KeyboardInterrupt:
                failure, code = "interrupted", 130
            if failure:
                # One line, no traceback: these are operating conditions, not bugs.
                _say(failure + _progress(summary, not opts.no_dedup))
                self.exitcode = code
                return
        if opts.dry_run:
            print(f"read {summary.lines} lines, would enqueue up to {summary.expanded} "
                  f"(dry run, before dedup), rejected {summary.rejected}", flush=True)
        else:
            print(summary, flush=True)
        self.exitcode = EXIT_REJECTED if summary.rejected else 0

    def _migrate(self, opts: argparse.Namespace) -> None:
        from meteorseed_scrapy.migrate import command as migration
        from meteorseed_scrapy.queue.keys import KeyLayout
        from meteorseed_scrapy.scrapy_redis_settings import redact
        from meteorseed_scrapy.settings import redis_url_from
        from meteorseed_scrapy.validators import ConfigError

        assert self.settings is not None
        try:
            keys = KeyLayout.from_settings(self.settings)
        except ConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None
        self.exitcode = migration.run_migration(
            self.settings, redis_url_from(self.settings), keys, opts, self._max_backlog(), redact
        )

    def _watch(self, args: list[str], opts: argparse.Namespace) -> int:
        import asyncio
        import os

        from meteorseed_scrapy.queue.connection import check_redis_url
        from meteorseed_scrapy.queue.keys import KeyLayout
        from meteorseed_scrapy.queue.shards import ShardMismatch
        from meteorseed_scrapy.scrapy_redis_settings import redact
        from meteorseed_scrapy.seeding import runner
        from meteorseed_scrapy.seeding.seeder import SeederConfig
        from meteorseed_scrapy.settings import redis_url_from, text_setting
        from meteorseed_scrapy.sites.lookup import SiteConfigs

        assert self.settings is not None
        if len(args) > 1 or opts.dry_run:
            raise UsageError("--watch takes at most one FILE (- reads stdin) and no --dry-run",
                             print_help=False)
        try:
            keys = KeyLayout.from_settings(self.settings)
            bounds = runner.bounds_from(self.settings.get)
        except ValueError as exc:
            raise UsageError(str(exc), print_help=False) from None
        if args and args[0] != "-" and not os.path.isfile(args[0]):
            _say(f"cannot read {args[0]}: no such file")
            return EXIT_FAILED
        runner.log_to(sys.stderr)
        config = SeederConfig(batch_size=opts.batch_size, max_backlog=self._max_backlog(),
                              fingerprinter=self._fingerprinter())
        sites = SiteConfigs(text_setting(self.settings, "METEORSEED_SITES_DIR"))
        redis_url = redis_url_from(self.settings)
        try:
            check_redis_url(redis_url)
        except ValueError as exc:
            _say(f"invalid Redis URL {redact(redis_url)!r}: {exc}")
            return EXIT_FAILED
        try:
            return asyncio.run(runner.watch(
                redis_url, keys, seed_file=args[0] if args else None,
                config=config, sites=sites, bounds=bounds, say=_say,
                on_error=_report_rejection, private_addresses=self._private_addresses()))
        except ShardMismatch as exc:
            _say(str(exc))
            return EXIT_FAILED

    def _private_addresses(self) -> bool:
        from meteorseed_scrapy.seeding.addresses import PRIVATE_SETTING
        from meteorseed_scrapy.settings import flag_setting
        from meteorseed_scrapy.validators import ConfigError

        assert self.settings is not None
        try:
            return flag_setting(self.settings, PRIVATE_SETTING)
        except ConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None

    def _fingerprinter(self) -> Any:
        """The project's REQUEST_FINGERPRINTER_CLASS, as its workers use it; None: canonical."""
        from meteorseed_scrapy.queue.dedup import settings_fingerprinter

        try:
            fingerprinter = settings_fingerprinter(self.settings)
        except Exception as exc:  # the project's class: not importable, or failing to build
            raise UsageError(f"REQUEST_FINGERPRINTER_CLASS: {exc}", print_help=False) from None
        if fingerprinter is not None:
            _say(f"dedup keys from REQUEST_FINGERPRINTER_CLASS {type(fingerprinter).__name__}")
        return fingerprinter

    def _max_backlog(self) -> int:
        from meteorseed_scrapy.settings import integer_setting
        from meteorseed_scrapy.validators import ConfigError

        assert self.settings is not None
        try:
            return integer_setting(self.settings, "METEORSEED_MAX_BACKLOG", minimum=0)
        except ConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None

    async def _expand(
        self, source: IO[bytes], redis_url: str, keys: KeyLayout, opts: argparse.Namespace,
        max_backlog: int, summary: ExpandSummary,
    ) -> None:
        from meteorseed_scrapy.queue.connection import async_client
        from meteorseed_scrapy.queue.writer import TaskWriter
        from meteorseed_scrapy.seeding.expand import expand_stream
        from meteorseed_scrapy.seeding.expanded import CountingWriter, ExpandedSeeds
        from meteorseed_scrapy.seeding.fetch import policies
        from meteorseed_scrapy.seeding.progress import Progress
        from meteorseed_scrapy.seeding.registry import SeedRegistry
        from meteorseed_scrapy.seeding.seed_lines import read_lines
        from meteorseed_scrapy.settings import text_setting
        from meteorseed_scrapy.sites.lookup import SiteConfigs

        # A bounded connect timeout: an unreachable host must fail fast, not hang the command.
        client = async_client(redis_url, socket_connect_timeout=10, socket_timeout=60)
        progress = Progress(sys.stderr)
        assert self.settings is not None
        rules = SiteConfigs(text_setting(self.settings, "METEORSEED_SITES_DIR"))
        sitemaps = policies(rules.get, self._private_addresses())
        # Seeds are registered as the dispatch API registers them (seeding/expanded.py).
        seeds = (None if opts.dry_run or opts.no_register
                 else ExpandedSeeds(SeedRegistry(client, keys)))
        lines = read_lines(source) if seeds is None else seeds.tap(read_lines(source))
        writer = (TaskWriter(client, keys, lane=opts.lane, fingerprinter=self._fingerprinter())
                  if seeds is None else CountingWriter(client, keys, seeds=seeds, lane=opts.lane,
                                                       fingerprinter=self._fingerprinter()))

        def on_error(rejection: Rejection) -> None:
            if seeds is not None:
                seeds.rejected(rejection)
            _report_rejection(rejection)

        try:
            if not opts.dry_run:
                await client.ping()  # fail before reading any input when Redis is not there
            await rules.refresh()
            await expand_stream(
                lines,
                writer,
                batch_size=opts.batch_size,
                on_error=on_error,
                max_backlog=max_backlog,
                dedup=not opts.no_dedup,
                on_wait=lambda backlog: _say(
                    f"{backlog} tasks waiting (more than {max_backlog}); "
                    "pausing until workers catch up"
                ),
                summary=summary,
                dry_run=opts.dry_run,
                on_batch=progress,
                rejects=rules.rejects,
                sitemaps=sitemaps,
            )
            if seeds is not None:
                await seeds.finish()
                for refused in seeds.unregistered:
                    _say(f"not registered: {refused}")
        finally:
            progress.done()
            await client.aclose()


def _report_rejection(rejection: Rejection) -> None:
    print(rejection, file=sys.stderr, flush=True)


def _progress(summary: ExpandSummary, dedup: bool) -> str:
    if not summary.lines:
        return ""
    rerun = "; re-running skips the URLs already enqueued" if dedup else ""
    return f" (stopped after: {summary}{rerun})"

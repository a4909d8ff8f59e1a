"""``scrapy seed-expand FILE|-``: expand JSON Lines seeds into exec tasks in the Redis stream.

Registered through the ``scrapy.commands`` entry point, so it works inside any Scrapy project
(reading its settings) and outside one (Scrapy's defaults plus ``-s``). It needs no crawler and
no reactor: its Redis work runs in a plain ``asyncio.run``. This module is the command's face
(help, options, the choice of job); one FILE's run is :mod:`.expand_file`, ``--watch`` the
seeder's runner, ``--from-scrapy-redis`` the migration's; what it prints is :mod:`.report`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

# Scrapy imports every entry-point command on each run (`scrapy list` too): this module imports
# only Scrapy's own command base at load time; Redis, asyncio and the seeding machinery are
# imported inside the methods that use them (tests/test_command_imports.py keeps it so).
if TYPE_CHECKING:
    import argparse

    from scrapy.settings import Settings

    from meteorseed_scrapy.queue.keys import KeyLayout

__all__ = ["Command"]

_T = TypeVar("_T")


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
        from meteorseed_scrapy.exit_codes import EXIT_ERROR, EXIT_INCOMPLETE
        from meteorseed_scrapy.seeding.seed_lines import MAX_LINE_BYTES
        from meteorseed_scrapy.seeding.seed_urls import MAX_URLS_PER_LINE

        return (
            "Read seeds, one JSON object per line, from FILE (or stdin for -), expand each into "
            "exec tasks and enqueue them in the Redis task stream, skipping URLs the site has "
            "already seen. A line may hold up to "
            f"{MAX_LINE_BYTES // (1024 * 1024)} MiB and {MAX_URLS_PER_LINE} URLs. A bad line is "
            "reported on stderr as 'line N: reason', a bad URL in a good line as "
            "'line N, url M: reason', where N counts lines from 1 and M is the 0-based index of "
            "the URL in payload.urls; everything else is still enqueued. The last stdout line "
            "reads 'read N lines, enqueued E, duplicates D, rejected R'. Exit code: 0 when "
            f"nothing was rejected, {EXIT_INCOMPLETE} when something was, {EXIT_ERROR} when Redis "
            "or the input failed. While more than METEORSEED_MAX_BACKLOG tasks wait in the "
            "stream, the command pauses until workers catch up. Settings: METEORSEED_REDIS_URL, "
            "METEORSEED_NAMESPACE, METEORSEED_MAX_BACKLOG (-s NAME=VALUE, else the environment, "
            "else the project's settings, as a worker reads them). Each seed is "
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
            help="expand, validate and count the URLs; enqueue nothing (Redis is not used); "
            "with --from-scrapy-redis: count what would migrate, write nothing",
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
        self._resolve_settings()

    def _resolve_settings(self) -> None:
        """The settings as a worker sees them: the environment's ``METEORSEED_*`` between the
        project's and ``-s``; misspelt names warned about, invalid values refused up front."""
        from meteorseed_scrapy.commands.report import say
        from meteorseed_scrapy.setting_checks import check_settings
        from meteorseed_scrapy.settings import apply_environment, warn_unknown_settings
        from meteorseed_scrapy.validators import ConfigError

        apply_environment(self.run_settings)
        warn_unknown_settings(self.run_settings, lambda line: say(f"warning: {line}"))
        try:
            check_settings(self.run_settings)
        except ConfigError as exc:
            raise UsageError(f"invalid setting {exc}", print_help=False) from None

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        from meteorseed_scrapy.commands.expand_file import expand_file
        from meteorseed_scrapy.settings import redis_url_from, text_setting

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
        redis_url = redis_url_from(self.run_settings)
        keys = self._keys()
        self.exitcode = expand_file(
            args[0], opts, redis_url=redis_url, keys=keys, max_backlog=self._max_backlog(),
            sites_dir=text_setting(self.run_settings, "METEORSEED_SITES_DIR"),
            fingerprinter=self._fingerprinter, private_addresses=self._private_addresses)

    def _migrate(self, opts: argparse.Namespace) -> None:
        from meteorseed_scrapy.migrate import command as migration
        from meteorseed_scrapy.scrapy_redis_settings import redact
        from meteorseed_scrapy.settings import redis_url_from

        settings = self.run_settings
        self.exitcode = migration.run_migration(
            settings, redis_url_from(settings), self._keys(), opts, self._max_backlog(), redact)

    def _watch(self, args: list[str], opts: argparse.Namespace) -> int:
        import asyncio
        import os

        from meteorseed_scrapy.commands.report import report_rejection, say
        from meteorseed_scrapy.exit_codes import EXIT_ERROR
        from meteorseed_scrapy.queue.keys import KeyLayout
        from meteorseed_scrapy.queue.plumbing.connection import check_redis_url
        from meteorseed_scrapy.queue.shards import ShardMismatch
        from meteorseed_scrapy.scrapy_redis_settings import redact
        from meteorseed_scrapy.seeding import runner
        from meteorseed_scrapy.seeding.seeder import SeederConfig
        from meteorseed_scrapy.settings import redis_url_from, text_setting
        from meteorseed_scrapy.sites.lookup import SiteConfigs

        settings = self.run_settings
        if len(args) > 1 or opts.dry_run:
            raise UsageError("--watch takes at most one FILE (- reads stdin) and no --dry-run",
                             print_help=False)
        try:
            keys = KeyLayout.from_settings(settings)
            bounds = runner.bounds_from(settings.get)
        except ValueError as exc:
            raise UsageError(str(exc), print_help=False) from None
        if args and args[0] != "-" and not os.path.isfile(args[0]):
            say(f"cannot read {args[0]}: no such file")
            return EXIT_ERROR
        runner.log_to(sys.stderr)
        config = SeederConfig(batch_size=opts.batch_size, max_backlog=self._max_backlog(),
                              fingerprinter=self._fingerprinter())
        sites = SiteConfigs(text_setting(settings, "METEORSEED_SITES_DIR"))
        redis_url = redis_url_from(settings)
        try:
            check_redis_url(redis_url)
        except ValueError as exc:
            say(f"invalid Redis URL {redact(redis_url)!r}: {exc}")
            return EXIT_ERROR
        try:
            return asyncio.run(runner.watch(
                redis_url, keys, seed_file=args[0] if args else None,
                config=config, sites=sites, bounds=bounds, say=say,
                on_error=report_rejection, private_addresses=self._private_addresses()))
        except ShardMismatch as exc:
            say(str(exc))
            return EXIT_ERROR

    @property
    def run_settings(self) -> Settings:
        """The settings of this run: Scrapy sets them before it parses the options (they are
        ``Optional`` on ``ScrapyCommand`` only because they are not there at construction)."""
        if self.settings is None:
            raise RuntimeError("seed-expand has no settings: Scrapy's cmdline sets them first")
        return self.settings

    def _setting(self, read: Callable[[Settings], _T]) -> _T:
        """``read(settings)``; an invalid value is a usage error naming its setting."""
        from meteorseed_scrapy.validators import ConfigError

        try:
            return read(self.run_settings)
        except ConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None

    def _private_addresses(self) -> bool:
        from meteorseed_scrapy.seeding.addresses import PRIVATE_SETTING
        from meteorseed_scrapy.settings import flag_setting

        return self._setting(lambda settings: flag_setting(settings, PRIVATE_SETTING))

    def _keys(self) -> KeyLayout:
        from meteorseed_scrapy.queue.keys import KeyLayout

        return self._setting(KeyLayout.from_settings)

    def _fingerprinter(self) -> Any:
        """The project's REQUEST_FINGERPRINTER_CLASS, as its workers use it; None: canonical."""
        from meteorseed_scrapy.commands.report import say
        from meteorseed_scrapy.queue.enqueue.dedup import settings_fingerprinter

        try:
            fingerprinter = settings_fingerprinter(self.run_settings)
        except Exception as exc:  # the project's class: not importable, or failing to build
            raise UsageError(f"REQUEST_FINGERPRINTER_CLASS: {exc}", print_help=False) from None
        if fingerprinter is not None:
            say(f"dedup keys from REQUEST_FINGERPRINTER_CLASS {type(fingerprinter).__name__}")
        return fingerprinter

    def _max_backlog(self) -> int:
        from meteorseed_scrapy.settings import integer_setting

        return self._setting(
            lambda settings: integer_setting(settings, "METEORSEED_MAX_BACKLOG", minimum=0))

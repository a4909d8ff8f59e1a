"""One ``scrapy seed-expand FILE|-`` run: the seeds of a file (or stdin) expanded into exec
tasks in the Redis task streams, progress and rejected seeds on stderr, the summary on stdout,
and the exit code.

The run registers its seeds in the seed registry, as ``POST /dispatch`` registers its seeds
(:class:`ExpandedSeeds`, the engine's watcher for the run): the console's Seeds table and
``GET /seeds`` list them with the run's counts (tasks enqueued, duplicates, URLs rejected) and
its error.

The command imports this module only when it runs such a job (commands/seed_expand.py), so
Redis, asyncio and the seeding machinery load here at the top.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO, Any, TextIO

from redis.exceptions import RedisError

from meteorseed_scrapy.commands.report import report_rejection, say, stopped_after
from meteorseed_scrapy.exit_codes import EXIT_ERROR, EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN, async_client
from meteorseed_scrapy.queue.shards import ShardMismatch
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.seeding.expand import expand_lines
from meteorseed_scrapy.seeding.expand_types import (
    ExpandOptions,
    ExpandSummary,
    SeedResult,
    SeedWatcher,
)
from meteorseed_scrapy.seeding.fetch import policies
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.seed_lines import read_lines
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError


def expand_file(path: str, opts: argparse.Namespace, *, redis_url: str, keys: KeyLayout,
                max_backlog: int, sites_dir: str, fingerprinter: Callable[[], Any],
                private_addresses: Callable[[], bool]) -> int:
    """Expand ``path`` (``-``: stdin) with the command's options; the exit code.
    ``fingerprinter`` and ``private_addresses`` read the command's settings when the run needs
    them (raising ``UsageError`` for a bad one)."""
    with ExitStack() as stack:
        try:
            source: IO[bytes] = (
                sys.stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
            )
        except OSError as exc:
            say(f"cannot read {path}: {exc.strerror or exc}")
            return EXIT_ERROR
        summary = ExpandSummary()
        code = EXIT_ERROR
        try:
            asyncio.run(_expand(source, redis_url, keys, opts, max_backlog, summary, sites_dir,
                                fingerprinter, private_addresses))
            failure = ""
        except REDIS_DOWN as exc:
            failure = f"cannot reach Redis at {redact(redis_url)}: {exc}"
        except ShardMismatch as exc:
            failure = str(exc)
        except RedisError as exc:
            failure = f"Redis error at {redact(redis_url)}: {exc}"
        except OSError as exc:
            failure = f"cannot read {path}: {exc.strerror or exc}"
        except KeyboardInterrupt:
            failure, code = "interrupted", 130
        if failure:
            # One line, no traceback: these are operating conditions, not bugs.
            say(failure + stopped_after(summary, not opts.no_dedup))
            return code
    if opts.dry_run:
        print(f"read {summary.lines} lines, would enqueue up to {summary.expanded} "
              f"(dry run, before dedup), rejected {summary.rejected}", flush=True)
    else:
        print(summary, flush=True)
    return EXIT_INCOMPLETE if summary.rejected else EXIT_OK


async def _expand(
    source: IO[bytes], redis_url: str, keys: KeyLayout, opts: argparse.Namespace,
    max_backlog: int, summary: ExpandSummary, sites_dir: str, fingerprinter: Callable[[], Any],
    private_addresses: Callable[[], bool],
) -> None:
    # A bounded connect timeout: an unreachable host must fail fast, not hang the command.
    client = async_client(redis_url, socket_connect_timeout=10, socket_timeout=60)
    progress = ProgressLine(sys.stderr)
    rules = SiteConfigs(sites_dir)
    sitemaps = policies(rules.get, private_addresses())
    seeds = (None if opts.dry_run or opts.no_register
             else ExpandedSeeds(SeedRegistry(client, keys)))
    writer = TaskWriter(client, keys, lane=opts.lane, fingerprinter=fingerprinter())
    options = ExpandOptions(
        batch_size=opts.batch_size,
        max_backlog=max_backlog,
        dedup=not opts.no_dedup,
        dry_run=opts.dry_run,
        rejects=rules.rejects,
        sitemaps=sitemaps,
        on_wait=lambda backlog: say(
            f"{backlog} tasks waiting (more than {max_backlog}); "
            "pausing until workers catch up"
        ),
        on_batch=progress,
    )
    try:
        if not opts.dry_run:
            await client.ping()  # fail before reading any input when Redis is not there
        await rules.refresh()
        await expand_lines(read_lines(source), writer, options, on_error=report_rejection,
                           watcher=seeds, summary=summary)
        if seeds is not None:
            await seeds.finish()
            for refused in seeds.unregistered:
                say(f"not registered: {refused}")
    finally:
        progress.done()
        await client.aclose()


class ProgressLine:
    """Progress of a long run on stderr: one redrawn line on a terminal, else plain periodic
    lines (logs and CI keep every line). Call with the running summary after each batch;
    reports at most every ``interval``."""

    def __init__(self, stream: TextIO, *, interval: float | None = None) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._interval = interval if interval is not None else (0.5 if self._tty else 10.0)
        self._start = time.monotonic()
        self._last = self._start
        self._drawn = False

    def __call__(self, summary: ExpandSummary) -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        self._write(summary, now)

    def _write(self, summary: ExpandSummary, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        line = (f"seed-expand: {summary.expanded:,} URLs ({summary.expanded / elapsed:,.0f}/s), "
                f"enqueued {summary.enqueued:,}, duplicates {summary.duplicates:,}, "
                f"rejected {summary.rejected:,}, {summary.lines:,} lines")
        if self._tty:
            self._stream.write("\r\x1b[K" + line)
            self._drawn = True
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def done(self) -> None:
        """End the redrawn line (a terminal), so the summary starts on its own line."""
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()


#: Registry calls in flight at once (each a round trip or two).
REGISTRY_CONCURRENCY = 32
#: How long a seed of the run stays leased until its run is recorded (a run that dies leaves
#: its seeds to a seeder after this).
SEED_LEASE_S = 3600.0


@dataclass
class SeedRun:
    rev: int | None = None  # the definition revision registered (None: not registered)
    enqueued: int = 0
    duplicates: int = 0
    rejected: int = 0
    error: str | None = None


class ExpandedSeeds(SeedWatcher):
    """The engine's watcher for a run: notes each seed the engine starts, registers the seeds
    started so far before each batch is sent (each leased while the run lasts, so no
    ``--watch`` seeder expands it a second time), adds each seed's counts to its run when it
    is done, and :meth:`finish` records every seed's run, which also schedules its next one
    when it has a schedule (a seed without one is done). Only a counter per seed is kept; the
    seeds' definitions are let go once registered."""

    def __init__(self, registry: SeedRegistry) -> None:
        self.registry = registry
        self.runs: dict[str, SeedRun] = {}
        self.unregistered: list[str] = []  # "seed_id: reason" of seeds the registry refused
        self.started_at = time.time()
        self._new: list[SeedTask] = []
        self._open: dict[int, SeedResult] = {}  # line number -> a seed not finished yet

    def started(self, result: SeedResult) -> None:
        self._new.append(result.seed)
        self.runs.setdefault(result.seed.seed_id, SeedRun())
        self._open[result.lineno] = result

    def finished(self, result: SeedResult) -> None:
        del self._open[result.lineno]
        run = self.runs[result.seed.seed_id]
        run.enqueued += result.enqueued
        run.duplicates += result.duplicates
        run.rejected += result.rejected
        if result.error is not None:
            run.error = result.error

    async def before_send(self) -> None:
        await self.register_new()

    async def register_new(self) -> None:
        """Register (and lease) the seeds read since the last call."""
        new, self._new = self._new, []
        for i in range(0, len(new), REGISTRY_CONCURRENCY):
            chunk = new[i:i + REGISTRY_CONCURRENCY]
            replies = await asyncio.gather(
                *(self.registry.put(seed, lease_s=SEED_LEASE_S) for seed in chunk),
                return_exceptions=True)
            for seed, reply in zip(chunk, replies, strict=True):
                if isinstance(reply, TaskError):
                    self.unregistered.append(f"{seed.seed_id}: {reply}")
                elif isinstance(reply, BaseException):
                    raise reply
                else:
                    self.runs[seed.seed_id].rev = reply.rev

    async def finish(self, error: str | None = None) -> int:
        """Register what is left and record every registered seed's run (``error``: the run
        stopped early, e.g. Redis failed); the number of runs recorded."""
        for result in list(self._open.values()):  # (what their batches did so far)
            self.finished(result)
        await self.register_new()
        items = [(seed_id, run) for seed_id, run in self.runs.items() if run.rev is not None]
        recorded = 0
        for i in range(0, len(items), REGISTRY_CONCURRENCY):
            chunk = items[i:i + REGISTRY_CONCURRENCY]
            replies = await asyncio.gather(*(self.registry.record_run(
                seed_id, started_at=self.started_at, ok=(run.error or error) is None,
                error=run.error or error, new_urls=run.enqueued, duplicates=run.duplicates,
                rejected=run.rejected, rev=run.rev) for seed_id, run in chunk))
            recorded += sum(1 for reply in replies if reply is not None)
        return recorded

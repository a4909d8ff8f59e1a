"""The long-running seeder: claims due seeds from the registry, expands each one with the
expansion engine (:func:`~meteorseed_scrapy.seeding.expand.expand_seeds`: dedup,
backpressure), records the run and lets the registry reschedule it.

Run it as ``scrapy seed-expand --watch [FILE|-]`` or ``meteorseed seeder``; any number may run
against one namespace (claims are atomic leases). Re-fetching: a seed's *own* URLs (list,
search, template pages: the pages that change) are enqueued on every run without URL dedup;
what they link to stays deduplicated as always. A sitemap seed's URLs are the items
themselves, so they stay deduplicated (the sitemap is re-read on each run anyway). See
docs/seeding.md for why.

It never crashes on Redis: an outage pauses it with one log line and it resumes by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.plumbing.connection import REDIS_FAILURES
from meteorseed_scrapy.seeding.adapt import Bounds, BoundsFor
from meteorseed_scrapy.seeding.expand import expand_seeds
from meteorseed_scrapy.seeding.expand_types import (
    ExpandOptions,
    ExpandSummary,
    Rejection,
    SeedResult,
    SeedWatcher,
)
from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.seeding.records import SeedRecord
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.seed_lines import parse_lines
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.validators import format_duration

if TYPE_CHECKING:

    from meteorseed_scrapy.queue.keys import KeyLayout
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

logger = logging.getLogger(__name__)

#: Seed types whose expanded URLs are the items themselves (deduplicated on every run).
ITEM_SEED_TYPES = frozenset({"sitemap"})
#: Seed types whose expansion blocks on I/O (fetched by the seeder): pulled on threads.
BLOCKING_SEED_TYPES = frozenset({"sitemap"})


@dataclass(frozen=True)
class SeederConfig:
    """How a seeder runs; seconds unless said otherwise."""

    lease_s: float = 600.0  # a claimed seed is ours this long, renewed every lease/3 while it runs
    poll_s: float = 1.0  # longest idle wait between two looks at the due set
    batch_size: int = 500
    max_backlog: int = DEFAULTS["METEORSEED_MAX_BACKLOG"]
    claim_limit: int = 1  # seeds claimed at once (run in turn; run more seeders for more)
    retry_s: float = 5.0  # wait between attempts while Redis is unreachable
    grace_s: float = 10.0  # on stop, how long the run in progress may take to finish
    # the project's Scrapy request fingerprinter for dedup keys (queue.enqueue.dedup), None:
    # canonical
    fingerprinter: Any = None

    def __post_init__(self) -> None:
        if self.lease_s <= 0 or self.poll_s <= 0 or self.retry_s <= 0 or self.grace_s < 0:
            raise ValueError("seeder: lease, poll and retry must be > 0, grace >= 0")
        if self.batch_size < 1 or self.claim_limit < 1 or self.max_backlog < 0:
            raise ValueError("seeder: batch_size and claim_limit must be >= 1, max_backlog >= 0")


@dataclass
class RegisterSummary:
    """What :meth:`Seeder.register` did with a seed file."""

    lines: int = 0
    registered: int = 0
    rejected: int = 0

    def __str__(self) -> str:
        return f"read {self.lines} lines, registered {self.registered}, rejected {self.rejected}"


@dataclass(frozen=True)
class RunResult:
    seed_id: str
    summary: ExpandSummary
    ok: bool
    error: str | None
    record: SeedRecord | None  # None: the seed was deleted while it ran


class Seeder:
    """Runs due seeds until stopped. ``on_run`` is called after each recorded run."""

    def __init__(self, redis: AsyncRedis, keys: KeyLayout, *,
                 config: SeederConfig | None = None, bounds_for: BoundsFor | None = None,
                 on_run: Callable[[RunResult], None] | None = None,
                 on_wait: Callable[[int], None] | None = None,
                 rejects: Callable[[str, str], str | None] | None = None,
                 sitemaps: Callable[[str], FetchPolicy] | None = None) -> None:
        # No I/O here.
        self.config = config or SeederConfig()
        self._options = ExpandOptions(
            batch_size=self.config.batch_size, max_backlog=self.config.max_backlog,
            rejects=rejects,  # site rules: allowed domains, blacklist
            sitemaps=sitemaps,  # how each site's sitemaps are fetched (default: safe)
            on_wait=on_wait)
        self.registry = SeedRegistry(redis, keys, bounds_for or (lambda site_id: Bounds()))
        self.writer = TaskWriter(redis, keys, fingerprinter=self.config.fingerprinter)
        self._redis = redis
        self._on_run = on_run
        self._outage_since: float | None = None
        self.runs = 0
        self.outages = 0

    async def register(self, lines: Iterable[str | bytes],
                       on_error: Callable[[Rejection], None]) -> RegisterSummary:
        """Put every valid seed of ``lines`` (JSON Lines) in the registry; a bad line is
        reported with its number and skipped. Redis errors propagate."""
        counts = ExpandSummary()
        registered = 0
        for _, seed in parse_lines(lines, on_error, counts):
            await self.registry.put(seed)
            registered += 1
        return RegisterSummary(counts.lines, registered, counts.bad_lines)

    async def run(self, stop: asyncio.Event, *,
                  before_claim: Callable[[], object] | None = None) -> None:
        """Claim and run due seeds until ``stop`` is set. ``before_claim`` (sync or async) runs
        before each look at the due set (the ``--watch`` command re-reads its file there)."""
        while not stop.is_set():
            try:
                if before_claim is not None:
                    result = before_claim()
                    if asyncio.iscoroutine(result):
                        await result
                records = await self.registry.claim_due(None, self.config.claim_limit,
                                                        self.config.lease_s)
                self._back()
                if not records:
                    await _wait(stop, await self._idle_wait())
                    continue
                for index, record in enumerate(records):
                    if stop.is_set():  # hand the rest back at once, for another seeder
                        for rest in records[index:]:
                            await self.registry.renew(rest.seed_id, 0)
                        break
                    await self._run_until_stopped(record, stop)
            except REDIS_FAILURES as exc:
                self._lost(exc)
                await _wait(stop, self.config.retry_s)

    def _lost(self, exc: BaseException) -> None:
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self.outages += 1
            logger.warning("seeder: Redis unavailable (%s); pausing, retrying every %s s",
                           exc or type(exc).__name__, self.config.retry_s)

    def _back(self) -> None:
        if self._outage_since is not None:
            logger.warning("seeder: Redis is back after %.0f s; resuming",
                           time.monotonic() - self._outage_since)
            self._outage_since = None

    async def _idle_wait(self) -> float:
        """Seconds until the earliest due seed, at most ``poll_s`` (a seed put meanwhile is
        due at once, so the seeder looks again soon)."""
        # (Two commands: a cluster pipeline refuses the keyless TIME.)
        secs, usecs = await self._redis.time()
        first = await self._redis.zrange(self.registry.keys.seeds_due, 0, 0, withscores=True)
        if not first:
            return self.config.poll_s
        now = int(secs) + int(usecs) / 1e6
        return max(0.05, min(self.config.poll_s, float(first[0][1]) - now))

    async def _run_until_stopped(self, record: SeedRecord, stop: asyncio.Event) -> None:
        """Run one seed; on stop, let it finish for ``grace_s``, then cancel it and hand the
        seed back (due at once) for the next seeder."""
        run = asyncio.ensure_future(self.run_seed(record))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({run, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                done, _ = await asyncio.wait({run}, timeout=self.config.grace_s)
                if not done:
                    run.cancel()
                    with contextlib.suppress(asyncio.CancelledError, *REDIS_FAILURES):
                        await run
                    logger.info("seeder: stopped while running seed %s; handed back",
                                record.seed_id)
                    with contextlib.suppress(*REDIS_FAILURES):
                        await self.registry.renew(record.seed_id, 0)
                    return
            run.result()  # a Redis error propagates to the outage handling
        finally:
            stopping.cancel()

    async def run_seed(self, record: SeedRecord) -> RunResult:
        """Expand one claimed seed now and record the run."""
        seed = record.seed
        started_at = await self._now()
        dedup = seed.task_type in ITEM_SEED_TYPES
        summary = ExpandSummary()
        watcher = _Watcher()
        ran = asyncio.Event()
        renewal = asyncio.ensure_future(self._renew(seed.seed_id, ran))
        error: str | None = None
        try:
            options = replace(self._options, dedup=dedup,
                              threads=seed.task_type in BLOCKING_SEED_TYPES)
            await expand_seeds([(1, seed)], self.writer, options, on_error=_ignore,
                               watcher=watcher, summary=summary)
        except REDIS_FAILURES:
            raise  # an outage: the lease runs out and the seed is run again later
        except Exception as exc:  # a bug must not stop the seeder: make it visible instead
            logger.exception("seeder: seed %s failed", seed.seed_id)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            ran.set()  # (a cancel landing inside a Redis command can be swallowed: see _renew)
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
        if error is None and watcher.result is not None:
            error = watcher.result.error
        ok = error is None
        after = await self.registry.record_run(
            seed.seed_id, started_at=started_at, ok=ok, error=error,
            new_urls=summary.enqueued if dedup else 0, duplicates=summary.duplicates,
            rejected=summary.rejected, enqueued=summary.enqueued, rev=record.rev)
        self.runs += 1
        _log_run(seed.seed_id, summary, error, after)
        result = RunResult(seed.seed_id, summary, ok, error, after)
        if self._on_run is not None:
            self._on_run(result)
        return result

    async def _now(self) -> float:
        secs, usecs = await self._redis.time()
        return int(secs) + int(usecs) / 1e6

    async def _renew(self, seed_id: str, ran: asyncio.Event) -> None:
        """Keep the lease of a long run (a sitemap index, a full backlog) alive until ``ran``.
        The event, not only the cancel, ends it: redis-py 8.2 can swallow a cancellation that
        lands while a command is in flight, and the loop would then renew for ever while the
        run waits for it to end (seen as a seeder test hanging under load)."""
        while not ran.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ran.wait(), self.config.lease_s / 3)
            if ran.is_set():
                return
            try:
                await self.registry.renew(seed_id, self.config.lease_s)
            except REDIS_FAILURES as exc:
                logger.warning("seeder: cannot renew the lease of seed %s: %s", seed_id, exc)


class _Watcher(SeedWatcher):
    """Holds the one seed's result of a run."""

    result: SeedResult | None = None

    def started(self, result: SeedResult) -> None:
        self.result = result


def _ignore(rejection: Rejection) -> None:
    pass  # (counted in the run's summary; the registry keeps the counts)


def _log_run(seed_id: str, summary: ExpandSummary, error: str | None,
             after: SeedRecord | None) -> None:
    if after is None:
        logger.info("seeder: seed %s was deleted while it ran", seed_id)
        return
    # (the local clock, for a log line only)
    nxt = ("not scheduled" if after.next_due is None
           else f"next in {format_duration(max(0.0, after.next_due - time.time()))}")
    if error is not None:
        logger.warning("seeder: seed %s failed (%d in a row): %s; %s", seed_id, after.failures,
                       error, nxt)
        return
    logger.info("seeder: seed %s: enqueued %d, duplicates %d, rejected %d, yield %s; %s",
                seed_id, summary.enqueued, summary.duplicates, summary.rejected,
                after.last_yield, nxt)


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)

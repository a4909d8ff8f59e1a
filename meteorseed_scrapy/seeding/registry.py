"""The seed registry in Redis: every seed's definition, its schedule and its run state.

Keys (see :mod:`meteorseed_scrapy.queue.keys`): ``<ns>:seed:<id>`` (hash: definition + state),
``<ns>:seeds`` and ``<ns>:seeds:by_site`` (indexes), ``<ns>:seeds:due`` (due times, which are
also the leases of claimed seeds) and ``<ns>:seeds:yield`` (child URLs counted by workers).
Every time that matters across machines is Redis ``TIME``, read inside the Lua scripts
(``lua/seed_*.lua``). The run state is what makes failing sources visible: ``last_run``,
``last_success``, ``last_error``, ``last_yield``, ``failures`` (consecutive).

A one-shot ``url_list`` seed (no schedule) keeps its URL list only until its run is recorded:
then its definition holds ``urls_count`` and ``urls_sha256`` instead (:func:`compact_definition`),
and ``full``, the digest of the whole definition, tells a later put of the same seed line
unchanged. A 1,000-URL seed went from ~83 KB of Redis to a few hundred bytes
(``benchmarks/left_per_url.py``).
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.seeding.adapt import Bounds, BoundsFor, RunState, plan_next
from meteorseed_scrapy.seeding.records import SeedRecord, record_from_hash, seed_to_dict
from meteorseed_scrapy.seeding.schedule import schedule_of
from meteorseed_scrapy.seeding.seed_urls import check_payload
from meteorseed_scrapy.task.canonical import canonical_json
from meteorseed_scrapy.task.exec_task import check_json_value
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

#: Longest ``last_error`` kept (a traceback-sized message is cut).
MAX_ERROR_CHARS = 2000


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def compact_definition(seed: SeedTask) -> str | None:
    """``seed``'s definition without its URL list (``urls_count`` and ``urls_sha256`` in its
    payload instead), or None when it has none to let go (not a ``url_list``, or compact
    already)."""
    urls = seed.payload.get("urls")
    if seed.task_type != "url_list" or not isinstance(urls, list) or not urls:
        return None
    try:
        digest = _digest(canonical_json(urls))
    except ValueError:  # a NaN registered before put() refused it: the seed is kept whole
        return None
    definition = seed_to_dict(seed)
    definition["payload"] = {**definition["payload"], "urls": [], "urls_count": len(urls),
                             "urls_sha256": digest}
    return canonical_json(definition)


class SeedRegistry:
    """Seeds by id in Redis, with their schedules and run state.

    ``bounds_for(site_id)`` gives the adaptive-interval bounds of a site (the seeder passes one
    built from the site rule configs and the ``METEORSEED_SCHEDULE_*`` settings); without it,
    the defaults (10 min, 2 h).
    """

    def __init__(self, redis: AsyncRedis, keys: KeyLayout,
                 bounds_for: BoundsFor | None = None) -> None:
        # No I/O here (not even reading the scripts).
        self._redis = redis
        self._keys = keys
        self._bounds_for = bounds_for
        self._scripts = scripts.Scripts(redis)

    @property
    def keys(self) -> KeyLayout:
        return self._keys

    async def put(self, seed: SeedTask, *, lease_s: float | None = None) -> SeedRecord:
        """Add or update ``seed``'s definition, keeping its run state; raises
        :class:`TaskError` (field ``schedule``, ``payload...``) for a seed that cannot run.

        A new or changed seed is due at once (scheduled or not: a seed without a schedule
        runs once); an unchanged one keeps its due time. With ``lease_s`` the caller means to
        expand the seed itself: instead of due at once, a new, changed or due seed is leased
        to the caller for ``lease_s`` seconds in the same atomic step (no seeder can claim
        it in between; the returned ``next_due`` is the lease's end). An unchanged seed that
        a seeder holds (not due) is not leased: compare ``next_due`` to tell.
        """
        check_payload(seed)  # the schedule too
        try:
            definition = canonical_json(seed_to_dict(seed))
        except ValueError:  # NaN or Infinity, in the payload (the other fields are typed)
            check_json_value("payload", seed.payload)
            raise TaskError("payload", "is not strict JSON (NaN or Infinity)") from None
        sched = "" if seed.schedule is None else canonical_json(seed.schedule)
        keys = self._keys
        await self._scripts["seed_put"](
            keys=[keys.seed(seed.seed_id), keys.seeds, keys.seeds_by_site, keys.seeds_due],
            args=[seed.seed_id, definition, seed.site_id, sched,
                  "" if lease_s is None else repr(float(lease_s)), _digest(definition)],
        )
        record = await self.get(seed.seed_id)
        if record is None:  # deleted by someone else in between: say so, do not pretend
            raise TaskError("seed_id", f"{seed.seed_id!r} was deleted while being registered")
        return record

    async def get(self, seed_id: str) -> SeedRecord | None:
        return (await self._load([seed_id]))[0]

    async def _load(self, seed_ids: list[str]) -> list[SeedRecord | None]:
        if not seed_ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for seed_id in seed_ids:
                pipe.hgetall(self._keys.seed(seed_id))
                pipe.zscore(self._keys.seeds_due, seed_id)
                pipe.hget(self._keys.seeds_yield, seed_id)
            replies = await pipe.execute()
        return [record_from_hash(seed_id, replies[3 * i], replies[3 * i + 1], replies[3 * i + 2])
                for i, seed_id in enumerate(seed_ids)]

    async def list(self, *, site_id: str | None = None, offset: int = 0,
                   limit: int = 100) -> list[SeedRecord]:
        """Seeds in seed_id order (of one site when ``site_id`` is given), paged."""
        if offset < 0 or limit < 0:
            raise ValueError(f"offset and limit must be >= 0, got {offset} and {limit}")
        if limit == 0:
            return []
        if site_id is None:
            raw = await self._redis.zrange(self._keys.seeds, offset, offset + limit - 1)
            ids = [text_of(member) for member in raw]
        else:
            raw = await self._redis.zrangebylex(
                self._keys.seeds_by_site, f"[{site_id}\t", f"({site_id}\n", offset, limit)
            ids = [text_of(member).split("\t", 1)[1] for member in raw]
        return [record for record in await self._load(ids) if record is not None]

    async def count(self, *, site_id: str | None = None) -> int:
        if site_id is None:
            return int(await self._redis.zcard(self._keys.seeds))
        return int(await self._redis.zlexcount(
            self._keys.seeds_by_site, f"[{site_id}\t", f"({site_id}\n"))

    async def delete(self, seed_id: str) -> bool:
        """Remove the seed and unschedule it; True when it existed."""
        keys = self._keys
        removed = await self._scripts["seed_delete"](
            keys=[keys.seed(seed_id), keys.seeds, keys.seeds_by_site, keys.seeds_due,
                  keys.seeds_yield],
            args=[seed_id],
        )
        return bool(int(removed))

    async def claim_due(self, now: float | None, limit: int, lease_s: float,
                        ) -> builtins.list[SeedRecord]:
        """Seeds due at ``now`` (None: Redis TIME), at most ``limit``, each leased for
        ``lease_s`` seconds in the same atomic step: no other seeder gets them until their
        run is recorded or the lease ends (renew a long run with :meth:`renew`)."""
        if limit < 1 or lease_s <= 0:
            raise ValueError(f"limit must be >= 1 and lease_s > 0, got {limit} and {lease_s}")
        reply = await self._scripts["seed_claim"](
            keys=[self._keys.seeds_due], args=["" if now is None else repr(float(now)), limit,
                                               repr(float(lease_s))])
        ids = [text_of(member) for member in reply[1:]]
        records = await self._load(ids)
        missing = [seed_id for seed_id, record in zip(ids, records, strict=True)
                   if record is None]
        # A due entry without its seed (a crash mid-delete) is dropped; one whose definition
        # is unreadable (logged) keeps its schedule for a version that can read it.
        gone = [seed_id for seed_id in missing
                if not await self._redis.exists(self._keys.seed(seed_id))]
        if gone:
            await self._redis.zrem(self._keys.seeds_due, *gone)
        return [record for record in records if record is not None]

    async def renew(self, seed_id: str, lease_s: float) -> bool:
        """Extend a claimed seed's lease to ``lease_s`` seconds from now (0: hand it back,
        due at once); False when the seed is no longer scheduled."""
        moved = await self._scripts["seed_lease"](
            keys=[self._keys.seeds_due], args=[seed_id, repr(float(lease_s))])
        return bool(int(moved))

    async def add_yield(self, counts: Mapping[str, int]) -> None:
        """Add new child URLs per seed_id, as counted by workers (children enqueued, not
        duplicates), in one round trip. The next :meth:`record_run` of each seed takes them
        into its yield (and so into its adaptive interval)."""
        args: list[str | int] = []
        for seed_id, n in counts.items():
            if n > 0:
                args += [seed_id, int(n)]
        if args:
            # Only registered seeds are counted (lua/seed_yield.lua): children of one-shot
            # seeds must not pile up in the hash.
            await self._scripts["seed_yield"](
                keys=[self._keys.seeds, self._keys.seeds_yield], args=args)

    async def record_run(self, seed_id: str, *, started_at: float, ok: bool, error: str | None,
                         new_urls: int, duplicates: int, rejected: int,
                         enqueued: int | None = None, rev: int | None = None,
                         ) -> SeedRecord | None:
        """Write a run's outcome and reschedule the seed (adaptive interval, cron, back-off).

        ``new_urls`` are the run's own new URLs (not duplicates); the children workers counted
        since the last run are added to them. ``enqueued`` (default ``new_urls``) counts tasks
        sent, re-fetched list pages included. ``rev`` is the definition revision the run
        expanded: when the seed changed meanwhile, its due time (now) is left alone. Returns
        None when the seed was deleted meanwhile (nothing is written).
        """
        keys = self._keys
        # TIME on its own: a cluster pipeline refuses keyless commands.
        secs, usecs = await self._redis.time()
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.seed(seed_id))
            pipe.hget(keys.seeds_yield, seed_id)
            hash_, pending = await pipe.execute()
        now = int(secs) + int(usecs) / 1e6
        before = record_from_hash(seed_id, hash_, None, pending)
        if before is None:
            return None
        children = before.pending_yield
        total = max(0, new_urls) + children
        site = self._bounds_for(before.seed.site_id) if self._bounds_for else Bounds()
        state = RunState(before.interval_s, before.yield_rate, before.last_run, before.failures)
        plan = plan_next(schedule_of(before.seed.schedule), site, state, now=now,
                         started_at=started_at, ok=ok, new_urls=total)
        values: dict[str, Any] = {
            "last_run": started_at, "last_finished": now, "last_yield": total,
            "last_enqueued": new_urls if enqueued is None else enqueued,
            "last_duplicates": duplicates, "last_rejected": rejected,
            "interval_s": plan.interval_s, "rate": plan.rate,
            "last_error": None if ok else (error or "failed")[:MAX_ERROR_CHARS],
        }
        if ok:
            values["last_success"] = now
        args: builtins.list[Any] = [seed_id, "" if rev is None else rev, children,
                           "" if plan.next_due is None else repr(plan.next_due),
                           "0" if ok else "1"]
        for name, value in values.items():
            args.extend((name, "" if value is None else repr(value) if isinstance(value, float)
                         else str(value)))
        written = await self._scripts["seed_record"](
            keys=[keys.seed(seed_id), keys.seeds_due, keys.seeds_yield], args=args)
        if not int(written):
            return None
        compact = compact_definition(before.seed) if plan.next_due is None else None
        if compact is not None:
            # (the definition that ran, unless it changed or was rescheduled meanwhile)
            await self._scripts["seed_compact"](
                keys=[keys.seed(seed_id), keys.seeds_due],
                args=[seed_id, before.rev, compact,
                      _digest(canonical_json(seed_to_dict(before.seed)))])
        return await self.get(seed_id)


__all__ = ["MAX_ERROR_CHARS", "SeedRegistry", "compact_definition"]

"""The seed registry in Redis: every seed's definition, its schedule and its run state.

Keys (see :mod:`meteorseed_scrapy.keys`): ``<ns>:seed:<id>`` (hash: definition + state),
``<ns>:seeds`` and ``<ns>:seeds:by_site`` (indexes), ``<ns>:seeds:due`` (due times, which are
also the leases of claimed seeds) and ``<ns>:seeds:yield`` (child URLs counted by workers).
Every time that matters across machines is Redis ``TIME``, read inside the Lua scripts
(``lua/seed_*.lua``). The run state is what makes failing sources visible: ``last_run``,
``last_success``, ``last_error``, ``last_yield``, ``failures`` (consecutive).
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy import scripts
from meteorseed_scrapy.keys import DEFAULT_LANE, KeyLayout
from meteorseed_scrapy.seeding.adapt import Bounds, BoundsFor, RunState, plan_next
from meteorseed_scrapy.seeding.expand import check_payload
from meteorseed_scrapy.seeding.schedule import schedule_of
from meteorseed_scrapy.tasks import SeedTask, TaskError

if TYPE_CHECKING:
    import redis.asyncio

logger = logging.getLogger(__name__)

#: Longest ``last_error`` kept (a traceback-sized message is cut).
MAX_ERROR_CHARS = 2000


def seed_to_dict(seed: SeedTask) -> dict[str, Any]:
    """``seed`` as its JSON line would hold it (defaults left out)."""
    out: dict[str, Any] = {"seed_id": seed.seed_id, "site_id": seed.site_id,
                           "task_type": seed.task_type, "payload": dict(seed.payload)}
    if seed.priority:
        out["priority"] = seed.priority
    for name in ("schedule", "parse_rule", "callback"):
        if getattr(seed, name) is not None:
            out[name] = getattr(seed, name)
    if seed.meta:
        out["meta"] = dict(seed.meta)
    if seed.lane != DEFAULT_LANE:
        out["lane"] = seed.lane
    return out


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class SeedRecord:
    """A seed's definition plus its run state (times are epoch seconds, Redis clock)."""

    seed: SeedTask
    added_at: float
    last_run: float | None
    last_success: float | None
    last_error: str | None  # of the last run; None once a run succeeds
    last_yield: int | None  # new URLs of the last run (not duplicates), workers' children too
    runs: int
    failures: int  # consecutive failed runs (0 after a success)
    next_due: float | None  # None: not scheduled (a one-shot seed that ran)
    interval_s: float | None  # the adaptive interval in use (every schedules)
    updated_at: float | None = None
    rev: int = 0  # definition revision, + 1 on each change
    last_enqueued: int | None = None
    last_duplicates: int | None = None
    last_rejected: int | None = None
    yield_rate: float | None = None  # EWMA of new URLs per hour
    pending_yield: int = 0  # children counted by workers since the last run

    @property
    def seed_id(self) -> str:
        return self.seed.seed_id

    @property
    def status(self) -> str:
        """``new`` (never run), ``ok`` or ``failing``."""
        if self.failures:
            return "failing"
        return "ok" if self.runs else "new"

    def to_json(self) -> dict[str, Any]:
        """JSON-safe, for the API and ``status --json``."""
        out: dict[str, Any] = {"seed_id": self.seed.seed_id, "site_id": self.seed.site_id,
                               "status": self.status, "seed": seed_to_dict(self.seed)}
        for f in fields(self):
            if f.name != "seed":
                out[f.name] = getattr(self, f.name)
        return out


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _float(raw: Mapping[str, str], name: str) -> float | None:
    value = raw.get(name)
    return None if value is None or value == "" else float(value)


def _int(raw: Mapping[str, str], name: str) -> int | None:
    value = raw.get(name)
    return None if value is None or value == "" else int(value)


def _record(seed_id: str, hash_: Mapping[Any, Any], due: Any, pending: Any) -> SeedRecord | None:
    raw = {_text(k): _text(v) for k, v in hash_.items()}
    if "def" not in raw:
        return None  # deleted between the index read and this one
    try:
        seed = SeedTask.from_dict(json.loads(raw["def"]))
    except (ValueError, TypeError) as exc:  # written by an older/newer version: say which
        logger.error("seed %s: stored definition is unreadable (%s)", seed_id, exc)
        return None
    return SeedRecord(
        seed=seed, added_at=_float(raw, "added_at") or 0.0,
        last_run=_float(raw, "last_run"), last_success=_float(raw, "last_success"),
        last_error=raw.get("last_error") or None, last_yield=_int(raw, "last_yield"),
        runs=_int(raw, "runs") or 0, failures=_int(raw, "failures") or 0,
        next_due=None if due is None else float(due), interval_s=_float(raw, "interval_s"),
        updated_at=_float(raw, "updated_at"), rev=_int(raw, "rev") or 0,
        last_enqueued=_int(raw, "last_enqueued"), last_duplicates=_int(raw, "last_duplicates"),
        last_rejected=_int(raw, "last_rejected"), yield_rate=_float(raw, "rate"),
        pending_yield=int(pending or 0),
    )


class SeedRegistry:
    """Seeds by id in Redis, with their schedules and run state.

    ``bounds_for(site_id)`` gives the adaptive-interval bounds of a site (the seeder passes one
    built from the site rule configs and the ``METEORSEED_SCHEDULE_*`` settings); without it,
    the defaults (10 min, 2 h).
    """

    def __init__(self, redis: redis.asyncio.Redis, keys: KeyLayout,
                 bounds_for: BoundsFor | None = None) -> None:
        # No I/O here (not even reading the scripts).
        self._redis = redis
        self._keys = keys
        self._bounds_for = bounds_for
        self._scripts: dict[str, Any] = {}

    @property
    def keys(self) -> KeyLayout:
        return self._keys

    def _script(self, name: str) -> Any:
        if name not in self._scripts:
            self._scripts[name] = scripts.register(self._redis, name)
        return self._scripts[name]

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
        definition = seed_to_dict(seed)
        sched = "" if seed.schedule is None else _canonical(seed.schedule)
        keys = self._keys
        await self._script("seed_put")(
            keys=[keys.seed(seed.seed_id), keys.seeds, keys.seeds_by_site, keys.seeds_due],
            args=[seed.seed_id, _canonical(definition), seed.site_id, sched,
                  "" if lease_s is None else repr(float(lease_s))],
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
        return [_record(seed_id, replies[3 * i], replies[3 * i + 1], replies[3 * i + 2])
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
            ids = [_text(member) for member in raw]
        else:
            raw = await self._redis.zrangebylex(
                self._keys.seeds_by_site, f"[{site_id}\t", f"({site_id}\n", offset, limit)
            ids = [_text(member).split("\t", 1)[1] for member in raw]
        return [record for record in await self._load(ids) if record is not None]

    async def count(self, *, site_id: str | None = None) -> int:
        if site_id is None:
            return int(await self._redis.zcard(self._keys.seeds))
        return int(await self._redis.zlexcount(
            self._keys.seeds_by_site, f"[{site_id}\t", f"({site_id}\n"))

    async def delete(self, seed_id: str) -> bool:
        """Remove the seed and unschedule it; True when it existed."""
        keys = self._keys
        removed = await self._script("seed_delete")(
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
        reply = await self._script("seed_claim")(
            keys=[self._keys.seeds_due], args=["" if now is None else repr(float(now)), limit,
                                               repr(float(lease_s))])
        ids = [_text(member) for member in reply[1:]]
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
        moved = await self._script("seed_lease")(
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
            await self._script("seed_yield")(
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
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.hgetall(keys.seed(seed_id))
            pipe.hget(keys.seeds_yield, seed_id)
            (secs, usecs), hash_, pending = await pipe.execute()
        now = int(secs) + int(usecs) / 1e6
        before = _record(seed_id, hash_, None, pending)
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
        written = await self._script("seed_record")(
            keys=[keys.seed(seed_id), keys.seeds_due, keys.seeds_yield], args=args)
        if not int(written):
            return None
        return await self.get(seed_id)

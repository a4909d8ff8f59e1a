"""The seed registry on a real Redis: upsert keeping run state, paging, delete, atomic claims,
run records (yield, errors, back-off) and the workers' yield counts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.adapt import Bounds
from meteorseed_scrapy.seeding.records import SeedRecord
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

T = TypeVar("T")


def seed(seed_id: str = "s1", site_id: str = "news", schedule: Any = "every 30m",
         urls: list[str] | None = None, **extra: Any) -> SeedTask:
    return SeedTask(seed_id=seed_id, site_id=site_id, task_type="url_list",
                    payload={"urls": urls or ["https://news.example/list"]},
                    schedule=schedule, **extra)


def run(redis_url: str, namespace: str,
        body: Callable[[SeedRegistry], Awaitable[T]], **kwargs: Any) -> T:
    async def main() -> T:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await body(SeedRegistry(client, KeyLayout(namespace), **kwargs))
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_put_get_keeps_run_state_and_is_json_safe(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> tuple[SeedRecord, SeedRecord, SeedRecord | None]:
        first = await reg.put(seed())
        await reg.record_run("s1", started_at=first.added_at, ok=True, error=None, new_urls=7,
                             duplicates=2, rejected=0)
        again = await reg.put(seed())  # unchanged: run state and due time stay
        return first, again, await reg.get("nope")

    first, again, missing = run(redis_url, namespace, body)
    assert missing is None
    assert first.status == "new" and first.runs == 0 and first.next_due is not None
    assert first.next_due >= first.added_at  # a new seed is due at once
    assert again.runs == 1 and again.last_yield == 7 and again.last_duplicates == 2
    assert again.next_due is not None and again.next_due > first.next_due  # not due again
    assert again.rev == first.rev == 1
    data = json.loads(json.dumps(again.to_json()))
    assert data["seed_id"] == "s1" and data["status"] == "ok" and data["runs"] == 1
    assert data["seed"]["schedule"] == "every 30m"


def test_changed_seed_is_due_at_once(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> tuple[SeedRecord, SeedRecord]:
        first = await reg.put(seed())
        await reg.record_run("s1", started_at=first.added_at, ok=True, error=None, new_urls=0,
                             duplicates=0, rejected=0)
        ran = await reg.get("s1")
        assert ran is not None and ran.next_due is not None and ran.next_due > first.added_at
        changed = await reg.put(seed(urls=["https://news.example/list", "https://news.example/b"]))
        return ran, changed

    ran, changed = run(redis_url, namespace, body)
    assert changed.rev == 2 and changed.runs == 1  # state kept
    assert changed.next_due is not None and ran.next_due is not None
    assert changed.next_due < ran.next_due  # due now, not at the old schedule


def test_bad_schedule_is_rejected_naming_the_field(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> None:
        await reg.put(seed(schedule="every 3 weeks"))

    with pytest.raises(TaskError) as info:
        run(redis_url, namespace, body)
    assert info.value.field.startswith("schedule")


def test_list_pages_by_site_and_count_and_delete(redis_url: str, namespace: str,
                                                 sync_redis: redis.Redis) -> None:
    async def body(reg: SeedRegistry) -> dict[str, Any]:
        for i in range(5):
            await reg.put(seed(f"a{i}", "site-a"))
        for i in range(3):
            await reg.put(seed(f"b{i}", "site-a.b", schedule=None))
        out: dict[str, Any] = {
            "all": [r.seed_id for r in await reg.list()],
            "page": [r.seed_id for r in await reg.list(offset=2, limit=3)],
            "a": [r.seed_id for r in await reg.list(site_id="site-a")],
            "a_page": [r.seed_id for r in await reg.list(site_id="site-a", offset=4, limit=9)],
            "ab": [r.seed_id for r in await reg.list(site_id="site-a.b")],
            "count": await reg.count(), "count_a": await reg.count(site_id="site-a"),
        }
        await reg.put(seed("a0", "site-c"))  # moved to another site
        out["a_after_move"] = [r.seed_id for r in await reg.list(site_id="site-a")]
        out["deleted"] = await reg.delete("a1")
        out["deleted_again"] = await reg.delete("a1")
        out["count_after"] = await reg.count()
        out["get_deleted"] = await reg.get("a1")
        return out

    out = run(redis_url, namespace, body)
    assert out["all"] == ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2"]
    assert out["page"] == ["a2", "a3", "a4"]
    assert out["a"] == ["a0", "a1", "a2", "a3", "a4"]  # not site-a.b's
    assert out["a_page"] == ["a4"]
    assert out["ab"] == ["b0", "b1", "b2"]
    assert (out["count"], out["count_a"]) == (8, 5)
    assert out["a_after_move"] == ["a1", "a2", "a3", "a4"]
    assert (out["deleted"], out["deleted_again"], out["count_after"]) == (True, False, 7)
    assert out["get_deleted"] is None
    keys = KeyLayout(namespace)
    assert sync_redis.zscore(keys.seeds_due, "a1") is None  # unscheduled too
    assert not sync_redis.exists(keys.seed("a1"))


def test_claim_due_is_atomic_across_many_claimers(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> list[list[str]]:
        for i in range(40):
            await reg.put(seed(f"s{i:02d}"))
        clients = [aioredis.Redis.from_url(redis_url) for _ in range(8)]
        try:
            regs = [SeedRegistry(c, reg.keys) for c in clients]
            batches = await asyncio.gather(*(r.claim_due(None, 5, 60) for r in regs for _ in
                                             range(2)))
        finally:
            for c in clients:
                await c.aclose()
        return [[r.seed_id for r in batch] for batch in batches]

    batches = run(redis_url, namespace, body)
    claimed = [seed_id for batch in batches for seed_id in batch]
    assert sorted(claimed) == [f"s{i:02d}" for i in range(40)]  # each exactly once


def test_claim_leases_until_recorded_or_expired(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> dict[str, Any]:
        rec = await reg.put(seed())
        now = rec.added_at + 1
        out: dict[str, Any] = {"first": [r.seed_id for r in await reg.claim_due(now, 10, 100)]}
        out["during"] = [r.seed_id for r in await reg.claim_due(now + 50, 10, 100)]
        out["after_lease"] = [r.seed_id for r in await reg.claim_due(now + 101, 10, 100)]
        out["future"] = [r.seed_id for r in await reg.claim_due(rec.added_at - 10, 10, 100)]
        return out

    out = run(redis_url, namespace, body)
    assert out == {"first": ["s1"], "during": [], "after_lease": ["s1"], "future": []}


def test_renew_and_hand_back(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> dict[str, Any]:
        await reg.put(seed())
        [claimed] = await reg.claim_due(None, 1, 100)
        out: dict[str, Any] = {"renewed": await reg.renew("s1", 1000)}
        after = await reg.get("s1")
        assert after is not None and after.next_due is not None
        out["pushed"] = after.next_due - claimed.added_at > 900
        out["handed_back"] = await reg.renew("s1", 0)
        out["again"] = [r.seed_id for r in await reg.claim_due(None, 1, 100)]
        await reg.delete("s1")
        out["renew_deleted"] = await reg.renew("s1", 10)
        return out

    assert run(redis_url, namespace, body) == {
        "renewed": True, "pushed": True, "handed_back": True, "again": ["s1"],
        "renew_deleted": False}


def test_failing_seed_records_error_and_backs_off(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> list[SeedRecord]:
        rec = await reg.put(seed(schedule={"every": "10m", "min": "10m", "max": "1h"}))
        out = []
        t = rec.added_at
        for _ in range(3):
            got = await reg.record_run("s1", started_at=t, ok=False, error="HTTP 500 on sitemap",
                                       new_urls=0, duplicates=0, rejected=0)
            assert got is not None
            out.append(got)
        ok = await reg.record_run("s1", started_at=t, ok=True, error=None, new_urls=1,
                                  duplicates=0, rejected=0)
        assert ok is not None
        out.append(ok)
        return out

    f1, f2, f3, ok = run(redis_url, namespace, body)
    assert (f1.failures, f2.failures, f3.failures) == (1, 2, 3)
    assert f3.last_error == "HTTP 500 on sitemap" and f3.status == "failing"
    assert f3.last_success is None and f3.runs == 3
    waits = [r.next_due - r.last_run for r in (f1, f2, f3)]  # type: ignore[operator]
    assert waits[0] < waits[1] < waits[2]  # backs off
    assert waits[2] <= 4 * 3600 + 60  # capped at 4x the max bound
    assert ok.failures == 0 and ok.last_error is None and ok.status == "ok"
    assert ok.last_success is not None


def test_add_yield_counts_children_into_the_next_run(redis_url: str, namespace: str,
                                                     sync_redis: redis.Redis) -> None:
    async def body(reg: SeedRegistry) -> tuple[SeedRecord, SeedRecord]:
        rec = await reg.put(seed())
        await reg.add_yield({"s1": 30, "other": 0})
        await reg.add_yield({"s1": 12})
        pending = await reg.get("s1")
        assert pending is not None and pending.pending_yield == 42
        done = await reg.record_run("s1", started_at=rec.added_at, ok=True, error=None,
                                    new_urls=3, duplicates=0, rejected=0, enqueued=1)
        assert done is not None
        return pending, done

    _, done = run(redis_url, namespace, body)
    assert done.last_yield == 45 and done.last_enqueued == 1 and done.pending_yield == 0
    assert sync_redis.hget(KeyLayout(namespace).seeds_yield, "s1") is None


def test_record_run_of_a_deleted_seed_writes_nothing(redis_url: str, namespace: str,
                                                     sync_redis: redis.Redis) -> None:
    async def body(reg: SeedRegistry) -> SeedRecord | None:
        rec = await reg.put(seed())
        await reg.delete("s1")
        return await reg.record_run("s1", started_at=rec.added_at, ok=True, error=None,
                                    new_urls=1, duplicates=0, rejected=0)

    assert run(redis_url, namespace, body) is None
    keys = KeyLayout(namespace)
    assert not sync_redis.exists(keys.seed("s1"))
    assert sync_redis.zscore(keys.seeds_due, "s1") is None


def test_change_during_a_run_keeps_it_due_now(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> tuple[SeedRecord, SeedRecord]:
        await reg.put(seed())
        [claimed] = await reg.claim_due(None, 1, 600)
        changed = await reg.put(seed(urls=["https://news.example/other"]))
        done = await reg.record_run("s1", started_at=claimed.added_at, ok=True, error=None,
                                    new_urls=0, duplicates=0, rejected=0, rev=claimed.rev)
        assert done is not None
        return changed, done

    changed, done = run(redis_url, namespace, body)
    assert done.next_due == changed.next_due  # the edit's "due now" survives the record
    assert done.runs == 1


def test_one_shot_seed_is_not_rescheduled(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> SeedRecord | None:
        rec = await reg.put(seed(schedule=None))
        assert rec.next_due is not None  # runs once
        return await reg.record_run("s1", started_at=rec.added_at, ok=True, error=None,
                                    new_urls=1, duplicates=0, rejected=0)

    done = run(redis_url, namespace, body)
    assert done is not None and done.next_due is None and done.runs == 1


@pytest.mark.parametrize(("payload", "field"), [
    ({"urls": ["https://news.example/a", float("nan")]}, "payload.urls[1]"),
    ({"urls": [float("-inf")]}, "payload.urls[0]"),
])
def test_a_seed_holding_nan_is_refused_naming_where(redis_url: str, namespace: str,
                                                    sync_redis: redis.Redis,
                                                    payload: dict[str, Any], field: str) -> None:
    # Stored, NaN would be shown by GET /seeds/{id} as JSON that no strict reader takes (a
    # one-off run reports such a URL at its position; a registered seed is kept as given).
    async def body(reg: SeedRegistry) -> None:
        await reg.put(SeedTask(seed_id="s1", site_id="news", task_type="url_list",
                               payload=payload, schedule="every 30m"))

    with pytest.raises(TaskError) as info:
        run(redis_url, namespace, body)
    assert (info.value.field, info.value.problem[:20]) == (field, "is not a finite numb")
    assert not sync_redis.exists(KeyLayout(namespace).seed("s1"))


def test_a_seed_stored_with_nan_before_it_was_refused_still_runs_and_is_kept_whole(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    async def body(reg: SeedRegistry) -> tuple[SeedRecord | None, SeedRecord | None]:
        rec = await reg.put(seed(schedule=None, urls=["https://news.example/a"]), lease_s=600)
        legacy = json.dumps({"seed_id": "s1", "site_id": "news", "task_type": "url_list",
                             "payload": {"urls": ["https://news.example/a", float("nan")]}},
                            sort_keys=True, separators=(",", ":"))
        sync_redis.hset(keys.seed("s1"), "def", legacy)  # (as an older version wrote it)
        stored = await reg.get("s1")
        done = await reg.record_run("s1", started_at=rec.added_at, ok=True, error=None,
                                    new_urls=1, duplicates=0, rejected=1, rev=rec.rev)
        return stored, done

    stored, done = run(redis_url, namespace, body)
    assert stored is not None and len(stored.seed.payload["urls"]) == 2
    assert done is not None and done.runs == 1
    assert len(done.seed.payload["urls"]) == 2  # not let go of: its digest cannot be taken


def test_a_one_shot_seed_lets_its_url_list_go_once_run(redis_url: str, namespace: str,
                                                      sync_redis: redis.Redis) -> None:
    urls = [f"https://news.example/a/{i}" for i in range(1000)]

    async def body(reg: SeedRegistry) -> tuple[SeedRecord | None, SeedRecord, SeedRecord,
                                                SeedRecord | None]:
        rec = await reg.put(seed(schedule=None, urls=urls), lease_s=600)
        done = await reg.record_run("s1", started_at=rec.added_at, ok=True, error=None,
                                    new_urls=1000, duplicates=0, rejected=0, rev=rec.rev)
        again = await reg.put(seed(schedule=None, urls=urls))  # the same line: unchanged
        other = await reg.put(seed(schedule=None, urls=urls[:10]))  # another list: changed
        return done, again, other, await reg.get("s1")

    done, again, other, last = run(redis_url, namespace, body)
    assert done is not None and done.seed.payload["urls"] == []
    assert done.seed.payload["urls_count"] == 1000 and len(done.seed.payload["urls_sha256"]) == 32
    assert again.rev == 1 and again.runs == 1
    assert other.rev == 2 and last is not None and last.seed.payload["urls"] == urls[:10]
    assert int(sync_redis.hlen(KeyLayout(namespace).seed("s1"))) > 0


def test_a_scheduled_or_changed_seed_keeps_its_url_list(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> tuple[SeedRecord | None, SeedRecord | None]:
        rec = await reg.put(seed())  # scheduled: it runs again from its definition
        kept = await reg.record_run("s1", started_at=rec.added_at, ok=True, error=None,
                                    new_urls=1, duplicates=0, rejected=0, rev=rec.rev)
        one = await reg.put(seed("s2", schedule=None), lease_s=600)
        await reg.put(seed("s2", schedule=None, urls=["https://news.example/new"]))
        changed = await reg.record_run("s2", started_at=one.added_at, ok=True, error=None,
                                       new_urls=1, duplicates=0, rejected=0, rev=one.rev)
        return kept, changed

    kept, changed = run(redis_url, namespace, body)
    assert kept is not None and kept.seed.payload["urls"] == ["https://news.example/list"]
    # Changed during its run: the new definition is due at once, with its list.
    assert changed is not None and changed.seed.payload["urls"] == ["https://news.example/new"]


def test_site_bounds_come_from_bounds_for(redis_url: str, namespace: str) -> None:
    async def body(reg: SeedRegistry) -> SeedRecord | None:
        rec = await reg.put(seed(schedule="every 30m"))
        return await reg.record_run("s1", started_at=rec.added_at, ok=True, error=None,
                                    new_urls=0, duplicates=0, rejected=0)

    done = run(redis_url, namespace, body, bounds_for=lambda site: Bounds(60, 2400))
    assert done is not None and done.interval_s == 2400  # doubled, capped by the site max


def test_put_with_a_lease_leaves_nothing_for_seeders_to_claim(redis_url: str,
                                                                namespace: str) -> None:
    async def body(reg: SeedRegistry) -> dict[str, Any]:
        leased = await reg.put(seed(), lease_s=300)
        out: dict[str, Any] = {"claimable": await reg.claim_due(None, 10, 60)}
        assert leased.next_due is not None
        out["lease"] = leased.next_due - leased.added_at
        await reg.put(seed("s2"))
        [held] = await reg.claim_due(None, 10, 600)  # a seeder holds s2 now
        again = await reg.put(seed("s2"), lease_s=300)  # unchanged and held: not leased
        out["held_kept"] = again.next_due == held.next_due
        return out

    out = run(redis_url, namespace, body)
    assert out["claimable"] == []
    assert 299 < out["lease"] < 301
    assert out["held_kept"]


def test_claim_drops_orphans_and_keeps_unreadable_seeds(redis_url: str, namespace: str,
                                                        sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    async def body(reg: SeedRegistry) -> list[SeedRecord]:
        await reg.put(seed("ok"))
        await reg.put(seed("odd"))
        sync_redis.hset(keys.seed("odd"), "def", '{"seed_id": "odd", "future": 1}')
        sync_redis.zadd(keys.seeds_due, {"orphan": 0})
        return await reg.claim_due(None, 10, 60)

    claimed = run(redis_url, namespace, body)
    assert [r.seed_id for r in claimed] == ["ok"]
    assert sync_redis.zscore(keys.seeds_due, "orphan") is None
    assert sync_redis.zscore(keys.seeds_due, "odd") is not None

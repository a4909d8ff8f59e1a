"""The one seed-expansion engine (seeding/expand.py) on a real Redis: each seed's result by
callback, exact whatever the batches; its options checked up front, the field named; every
line parsed once, with or without registration; the seeder hands it the seed itself."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.api import expansion
from meteorseed_scrapy.api.expansion import Progress
from meteorseed_scrapy.commands.expand_file import ExpandedSeeds
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.seeding import seed_lines
from meteorseed_scrapy.seeding.expand import expand_lines, expand_seeds
from meteorseed_scrapy.seeding.expand_types import (
    ExpandOptions,
    ExpandSummary,
    Rejection,
    SeedResult,
    SeedWatcher,
)
from meteorseed_scrapy.seeding.records import SeedRecord
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.seeder import Seeder
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.testing.polling import wait_until


def seed(seed_id: str, urls: list[Any], **fields: Any) -> SeedTask:
    return SeedTask.from_dict({"seed_id": seed_id, "site_id": "news", "task_type": "url_list",
                               "payload": {"urls": urls}, **fields})


class Recorder(SeedWatcher):
    """Every hook call, in order; checks that a seed is finished once, after it started."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.done: dict[int, SeedResult] = {}
        self.sends = 0

    def started(self, result: SeedResult) -> None:
        self.events.append(("started", result.seed.seed_id))

    async def before_send(self) -> None:
        self.sends += 1

    def finished(self, result: SeedResult) -> None:
        assert result.lineno not in self.done and result.batches == 0
        self.events.append(("finished", result.seed.seed_id))
        self.done[result.lineno] = result


def run(redis_url: str, body: Any) -> Any:
    async def main() -> Any:
        client = async_client(redis_url)
        try:
            return await body(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.lists(st.integers(0, 4), max_size=7), min_size=1, max_size=6),
       batch=st.integers(1, 6), dry=st.booleans())
def test_each_seed_gets_its_exact_result_whatever_the_batches(
        redis_url: str, namespace: str, plan: list[list[int]], batch: int, dry: bool) -> None:
    salt = uuid.uuid4().hex  # (a fresh dedup set for each example, shrinks included)
    # plan[i]: seed i's URLs as numbers (a shared pool: duplicates across seeds); -1 is bad.
    seeds = [(i + 1, seed(f"s{i}", [f"https://a.example/{salt}/{n}" if n else "nope"
                                    for n in urls])) for i, urls in enumerate(plan)]
    recorder = Recorder()

    async def body(client: Any) -> ExpandSummary:
        writer = TaskWriter(client, KeyLayout(f"{namespace}-{salt}"))
        return await expand_seeds(seeds, writer, ExpandOptions(batch_size=batch, dry_run=dry),
                                  on_error=lambda r: None, watcher=recorder)

    summary = run(redis_url, body)
    assert [e for e in recorder.events if e[0] == "started"] == [
        ("started", s.seed_id) for _, s in seeds]
    assert sorted(recorder.done) == [lineno for lineno, _ in seeds]  # every seed, once
    seen: set[int] = set()
    for lineno, urls in enumerate(plan, start=1):
        result = recorder.done[lineno]
        good = [n for n in urls if n]
        assert result.rejected == len(urls) - len(good)
        if dry:
            assert (result.enqueued, result.duplicates) == (0, 0)
            continue
        fresh = len(set(good) - seen)
        seen.update(good)
        assert (result.enqueued, result.duplicates) == (fresh, len(good) - fresh)
    assert summary.enqueued == sum(r.enqueued for r in recorder.done.values())
    assert recorder.sends == (0 if dry else -(-summary.expanded // batch))


def test_a_seed_is_finished_only_once_its_last_batch_is_answered(redis_url: str,
                                                                 namespace: str) -> None:
    recorder = Recorder()

    class Slow(TaskWriter):
        async def enqueue(self, encoded: Any, order: Any = None, holds: Any = None) -> Any:
            result = await super().enqueue(encoded, order, holds)
            await asyncio.sleep(0.01)  # (the engine goes on meanwhile)
            recorder.events.append(("answered", str(len(encoded))))
            return result

    seeds = [(1, seed("a", [f"https://a.example/{i}" for i in range(5)])),
             (2, seed("b", ["https://b.example/1"]))]
    run(redis_url, lambda client: expand_seeds(
        seeds, Slow(client, KeyLayout(namespace)), ExpandOptions(batch_size=3),
        on_error=lambda r: None, watcher=recorder))
    # a's tasks: 3 in batch 1, 2 in batch 2 (with b's one); both finish after batch 2
    assert recorder.events == [("started", "a"), ("started", "b"), ("answered", "3"),
                               ("answered", "3"), ("finished", "a"), ("finished", "b")]
    assert (recorder.done[1].enqueued, recorder.done[2].enqueued) == (5, 1)


@pytest.mark.parametrize(("options", "field"), [
    ({"batch_size": 0}, "batch_size"), ({"batch_size": -3}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"), ({"batch_size": "500"}, "batch_size"),
    ({"batch_size": True}, "batch_size"), ({"max_backlog": -1}, "max_backlog"),
    ({"max_backlog": None}, "max_backlog"), ({"dedup": "no"}, "dedup"),
    ({"dry_run": 1}, "dry_run"), ({"threads": None}, "threads"),
])
def test_invalid_options_are_refused_with_the_field_named(options: dict[str, Any],
                                                          field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        ExpandOptions(**options)


@given(batch_size=st.one_of(st.integers(), st.floats(), st.text(max_size=3), st.none()),
       max_backlog=st.one_of(st.integers(), st.floats(), st.none()))
def test_options_accept_exactly_the_valid_numbers(batch_size: Any, max_backlog: Any) -> None:
    valid = (type(batch_size) is int and batch_size >= 1, type(max_backlog) is int
             and max_backlog >= 0)
    try:
        options = ExpandOptions(batch_size=batch_size, max_backlog=max_backlog)
    except ValueError as exc:
        assert not all(valid)
        assert str(exc).startswith("batch_size: " if not valid[0] else "max_backlog: ")
    else:
        assert all(valid) and (options.batch_size, options.max_backlog) == (batch_size,
                                                                           max_backlog)


def test_registration_parses_every_line_once(redis_url: str, namespace: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = seed_lines.parse_seed_line

    def counting(line: Any, lineno: int) -> SeedTask:
        calls.append(lineno)
        return real(line, lineno)

    monkeypatch.setattr(seed_lines, "parse_seed_line", counting)
    lines = [json.dumps({"seed_id": f"s{i}", "site_id": "news", "task_type": "url_list",
                         "payload": {"urls": [f"https://a.example/{i}", "nope"]}})
             for i in range(4)] + ["{bad"]
    errors: list[Rejection] = []

    async def body(client: Any) -> dict[str, tuple[int | None, int | None]]:
        keys = KeyLayout(namespace)
        seeds = ExpandedSeeds(SeedRegistry(client, keys))
        await expand_lines(lines, TaskWriter(client, keys), ExpandOptions(batch_size=3),
                           on_error=errors.append, watcher=seeds)
        await seeds.finish()
        records = await SeedRegistry(client, keys).list(limit=100)
        return {r.seed.seed_id: (r.last_enqueued, r.last_rejected) for r in records}

    runs = run(redis_url, body)
    assert calls == [1, 2, 3, 4, 5]
    assert runs == {f"s{i}": (1, 1) for i in range(4)}
    assert [(e.lineno, e.url_position) for e in errors] == [(1, 1), (2, 1), (3, 1), (4, 1),
                                                           (5, None)]


def test_the_seeder_hands_the_engine_the_seed_itself(redis_url: str, namespace: str,
                                                     sync_redis: redis.Redis,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def no_parse(line: Any, lineno: int) -> SeedTask:
        raise AssertionError("a claimed seed is parsed again")

    monkeypatch.setattr(seed_lines, "parse_seed_line", no_parse)
    own = seed("own", ["https://a.example/1", "https://a.example/2", "nope"])

    async def body(client: Any) -> tuple[int, int, str | None]:
        seeder = Seeder(client, KeyLayout(namespace))
        record: SeedRecord = await seeder.registry.put(own)
        result = await seeder.run_seed(record)
        return result.summary.enqueued, result.summary.rejected, result.error

    assert run(redis_url, body) == (2, 1, None)
    assert sync_redis.xlen(KeyLayout(namespace).stream) == 2


def test_a_dispatch_expansion_keeps_its_lease_and_stops_when_asked(
        redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Any) -> None:
    monkeypatch.setattr(expansion, "KEEPALIVE_S", 0.01)
    progress = Progress("big")
    renewals: list[int] = []
    answered: list[int] = []  # tasks enqueued by each batch answered

    class Held(TaskWriter):
        """Holds each batch until the lease was renewed twice more: a slow Redis."""

        async def enqueue(self, encoded: Any, order: Any = None, holds: Any = None) -> Any:
            target = len(renewals) + 2
            await wait_until(lambda: len(renewals) >= target, timeout=30)
            result = await super().enqueue(encoded, order, holds)
            answered.append(result.enqueued)
            return result

    async def keepalive() -> None:
        renewals.append(1)
        if len(renewals) >= 6 and answered:
            progress.stop_requested = True  # (a DELETE /seeds/big)

    big = SeedTask.from_dict({"seed_id": "big", "site_id": "news", "task_type": "url_template",
                              "payload": {"template": "https://a.example/{page}",
                                          "params": {"page": {"start": 1, "stop": 100_000}}}})

    async def body(client: Any) -> None:
        with pytest.raises(asyncio.CancelledError):
            await expansion.expand_seed(big, "", progress, Held(client, KeyLayout(namespace)),
                                        SiteConfigs(tmp_path), 10**9, keepalive)

    run(redis_url, body)
    assert len(renewals) >= 6
    assert progress.enqueued == sum(answered) < 100_000  # the counts so far are kept


def test_the_api_lease_keeper_ends_though_a_renewal_swallowed_the_cancel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-py 8.2 can swallow a cancellation that lands while a command is in flight: the
    keeper of a dispatched seed's lease must end all the same once the expansion is over."""
    monkeypatch.setattr(expansion, "KEEPALIVE_S", 0.01)
    swallowed: list[bool] = []

    async def renewal_in_flight() -> None:
        try:
            await asyncio.sleep(0.2)  # (a command that takes long to answer)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(True)  # as redis-py may: once, the cancel is lost

    async def main() -> bool:
        done = asyncio.Event()
        keeper = asyncio.ensure_future(expansion._keep(renewal_in_flight, done))
        await asyncio.sleep(0.05)  # (inside a renewal by now)
        done.set()
        keeper.cancel()
        await asyncio.wait([keeper], timeout=30)  # (a bound, not a pace)
        return keeper.done()

    assert asyncio.run(main()), "the keeper renews for ever"
    assert swallowed == [True]

"""A burst of 429s is one strike: only a request granted its permit after the site's last pause
began strikes; the answers to requests already in flight confirm that pause (real Redis)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.middlewares import BackoffMiddleware
from meteorseed_scrapy.politeness.gate import PAUSE_LEAD_S, SiteGate, granted_at
from meteorseed_scrapy.politeness.permits import PermitDesk
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.politeness.runtime import CrawlRuntime
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.context import LEASE_META_KEY, TASK_META_KEY
from meteorseed_scrapy.task.exceptions import DeferReason, TaskDeferred
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.testing.polling import wait_until

T = TypeVar("T")
OPEN = SiteLimits(rate=1000.0, burst=1000, concurrency=100)




def make_gate(client: Any, ns: str, base: float = 1.0, name: str = "c1") -> SiteGate:
    return SiteGate(client, KeyLayout(ns), lambda _site: OPEN, name, Backoff(base, 300.0))


def strikes_of(sync_redis: redis.Redis, ns: str, site: str = "s") -> int:
    record = sync_redis.get(KeyLayout(ns).site(site, "strikes"))
    return int(str(record).split(":")[0]) if record else 0


def test_sixteen_429s_to_requests_in_flight_together_are_one_strike(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    async def scenario(client: Any) -> list[Any]:
        gate = make_gate(client, namespace)
        leases = (await gate.acquire("s", 16)).lease_ids
        assert len(leases) == 16
        # All sixteen answer 429 at once, in any order.
        return list(await asyncio.gather(*(gate.pause("s", 3.0, granted_at(lease))
                                           for lease in leases)))

    results = run(redis_url, scenario)
    assert [r.new_strike for r in results].count(True) == 1
    assert {r.strikes for r in results} == {1}
    assert strikes_of(sync_redis, namespace) == 1
    # Retry-After as given, plus at most 10 % jitter: no escalation, and every deferred task
    # waits for the site's pause, no longer.
    assert all(0 < r.pause_s <= 3.3 for r in results)
    assert max(r.pause_s for r in results) >= 3.0
    assert sync_redis.pttl(KeyLayout(namespace).site("s", "pause")) <= 3300


def test_a_429_after_the_pause_ended_strikes_again_a_late_answer_only_confirms(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    async def scenario(client: Any) -> tuple[Any, Any, Any]:
        gate = make_gate(client, namespace, base=0.05)
        old, slow = (await gate.acquire("s", 2)).lease_ids
        first = await gate.pause("s", None, granted_at(old))

        async def resumed() -> list[str]:
            return (await gate.acquire("s", 1)).lease_ids

        (fresh,) = await wait_until(resumed, 10, 0.01)
        # A slow request sent before the first pause answers now: no strike.
        late = await gate.pause("s", None, granted_at(slow))
        again = await gate.pause("s", None, granted_at(fresh))
        return first, late, again

    first, late, again = run(redis_url, scenario)
    assert (first.strikes, first.new_strike) == (1, True)
    assert (late.strikes, late.new_strike) == (1, False)
    assert (again.strikes, again.new_strike) == (2, True)
    assert strikes_of(sync_redis, namespace) == 2


def test_a_confirming_answer_lengthens_the_pause_to_its_own_retry_after_only(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    async def scenario(client: Any) -> tuple[float, float, float]:
        gate = make_gate(client, namespace)
        a, b, c = (await gate.acquire("s", 3)).lease_ids
        first = await gate.pause("s", 1.0, granted_at(a))
        longer = await gate.pause("s", 5.0, granted_at(b))
        none = await gate.pause("s", None, granted_at(c))
        return first.pause_s, longer.pause_s, none.pause_s

    first, longer, none = run(redis_url, scenario)
    assert 1.0 <= first <= 1.1
    assert 4.9 < longer <= 5.0  # the site's word, without escalation or jitter
    assert 4.8 < none <= 5.0  # a pause never shrinks
    assert strikes_of(sync_redis, namespace) == 1


def test_a_request_without_a_known_grant_time_strikes(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    async def scenario(client: Any) -> list[int]:
        gate = make_gate(client, namespace)
        return [(await gate.pause("s", None, None)).strikes for _ in range(3)]

    assert run(redis_url, scenario) == [1, 2, 3]


@pytest.mark.parametrize("record,strikes", [
    ("7", 8),  # a bare count (older versions): the next strike is the 8th
    ("garbage", 1), ("", 1), ("-5", 1), ("inf", 1), ("nan", 1), ("1e400", 1), ("3:abc", 1),
    ("99999999999999999999:1", 1_000_001),
])
def test_a_corrupt_strikes_record_reads_as_what_it_can_be(
    redis_url: str, namespace: str, sync_redis: redis.Redis, record: str, strikes: int
) -> None:
    sync_redis.set(KeyLayout(namespace).site("s", "strikes"), record)

    async def scenario(client: Any) -> Any:
        return await make_gate(client, namespace, base=0.01).pause("s", 1.0, None)

    result = run(redis_url, scenario)
    assert result.new_strike and result.strikes == strikes
    assert 1.0 <= result.pause_s <= 300 * 1.1  # Retry-After at least, the cap at most


@given(st.text(), st.integers(min_value=1, max_value=10**15 - 1), st.text())
def test_granted_at_reads_back_any_lease_id_shape(prefix: str, ms: int, tail: str) -> None:
    assert granted_at(f"{prefix}@{ms}:{tail.replace('@', '')}") == ms


@given(st.one_of(st.text(), st.none(), st.integers(), st.binary(), st.floats(),
                 st.lists(st.text())))
def test_granted_at_never_raises_and_never_invents_a_time(value: object) -> None:
    got = granted_at(value)
    assert got is None or (isinstance(value, str) and str(got) in value and got > 0)


@pytest.mark.parametrize("value", ["c1:3:1", "c1:3@:1", "c1:3@12", "c1@-5:1", "c1@0:1",
                                   "c1@\uff11\uff12:1", "c1@12a:1", "@:", "c1@1" + "0" * 20 + ":1"])
def test_granted_at_refuses_what_is_not_a_grant_time(value: str) -> None:
    assert granted_at(value) is None


def test_a_pause_seen_here_holds_back_the_permits_in_hand_and_gives_them_back(
    redis_url: str, namespace: str
) -> None:
    async def scenario(client: Any) -> tuple[list[str], list[str], int, bool]:
        gate = make_gate(client, namespace)
        desk = PermitDesk(gate, MemoryStatsCollector(SimpleNamespace(settings=Settings())))
        await desk.refill({"s": 4, "t": 2}, 10)
        before = sorted(desk.ready_sites())
        await gate.pause("s", 2.0, None)
        after = sorted(desk.ready_sites())
        waits = await desk.refill({"s": 4, "t": 2}, 10)
        return before, after, len(desk.to_release), "s" in waits and 1.5 < waits["s"] <= 2.2

    before, after, given_back, waits = run(redis_url, scenario)
    assert before == ["s", "t"] and after == ["t"]
    assert given_back == 4 and waits


def _middleware(gate: SiteGate) -> tuple[BackoffMiddleware, MemoryStatsCollector]:
    stats = MemoryStatsCollector(SimpleNamespace(settings=Settings()))
    settings = {"RETRY_HTTP_CODES": [500, 503], "RETRY_EXCEPTIONS": [],
                "METEORSEED_BACKOFF_BASE": 1.0, "METEORSEED_BACKOFF_MAX": 300.0}
    runtime = CrawlRuntime.of(get_crawler(Spider, settings_dict=settings))
    runtime.gate = gate  # (the test's own, on its namespace)
    runtime.open_worker()
    mw = BackoffMiddleware(runtime, 2, stats, Settings(settings))
    return mw, stats


def _answer(task: ExecTask, lease: str | None, status: int = 429,
            retry_after: str = "3") -> tuple[Request, Response]:
    request = Request(task.url, meta={TASK_META_KEY: task, LEASE_META_KEY: lease})
    return request, Response(task.url, status=status, headers={"Retry-After": retry_after},
                             request=request)


def test_the_middleware_defers_a_burst_for_the_pause_and_counts_one_strike(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = [ExecTask.create(seed_id="s1", site_id="s", url=f"https://s.example/{i}")
             for i in range(16)]

    async def scenario(client: Any) -> tuple[list[TaskDeferred], dict[str, Any]]:
        gate = make_gate(client, namespace)
        mw, stats = _middleware(gate)
        leases = (await gate.acquire("s", 16)).lease_ids
        deferred = []
        for task, lease in zip(tasks, leases, strict=True):
            with pytest.raises(TaskDeferred) as caught:
                await mw.process_response(*_answer(task, lease))
            deferred.append(caught.value)
        return deferred, stats.get_stats()

    with caplog.at_level(logging.WARNING, "meteorseed_scrapy.middlewares"):
        deferred, stats = run(redis_url, scenario)
    assert stats["meteorseed/throttled/s/429"] == 16
    assert stats["meteorseed/throttled/s/strikes"] == 1
    assert len([r for r in caplog.records if "strike" in r.getMessage()]) == 1
    assert all(d.why is DeferReason.PAUSED and not d.count_retry for d in deferred)
    # Each waits for what is left of the site's pause, due back PAUSE_LEAD_S ahead of its end
    # (the gate holds it until then): the first 3 s (+ jitter), the rest no longer.
    assert 3.0 <= deferred[0].delay_s + PAUSE_LEAD_S <= 3.3
    assert all(0 < d.delay_s <= deferred[0].delay_s for d in deferred)


def test_a_corrupt_pause_state_defers_the_task_and_is_logged_once(
    redis_url: str, namespace: str, sync_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    sync_redis.hset(KeyLayout(namespace).site("s", "strikes"), "x", "1")  # the wrong type
    task = ExecTask.create(seed_id="s1", site_id="s", url="https://s.example/1")

    async def scenario(client: Any) -> list[TaskDeferred]:
        mw, _ = _middleware(make_gate(client, namespace))
        out = []
        for _ in range(3):
            with pytest.raises(TaskDeferred) as caught:
                await mw.process_response(*_answer(task, None, retry_after="2"))
            out.append(caught.value)
        return out

    with caplog.at_level(logging.DEBUG, "meteorseed_scrapy.politeness.site_errors"):
        deferred = run(redis_url, scenario)
    # Its Retry-After, honoured (in full: no pause in Redis holds it back)
    assert all(2.0 <= d.delay_s <= 2.2 for d in deferred)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "WRONGTYPE" in errors[0].getMessage()
    assert "site s" in errors[0].getMessage()

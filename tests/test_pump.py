"""StreamPump, through the verbs the scheduler uses, against a real redis-server.

No Scrapy engine: a test plays the engine (takes requests, hands responses to the scrape, says
when it is over). pytest-asyncio is not used: each test runs its coroutine with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig, BreakerState
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.consume.acks import TaskRecords
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.consume.lanes import LaneWeights
from meteorseed_scrapy.queue.enqueue.enqueue_calls import AddResult, Encoded
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.spiders import worker_spider
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.redis_full import RedisFull
from meteorseed_scrapy.settings import WorkerConfig
from meteorseed_scrapy.task.context import LEASE_META_KEY, TASK_META_KEY, task_of
from meteorseed_scrapy.task.exceptions import DeferReason, TaskDeferred
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_until
from meteorseed_scrapy.worker.breaker_states import BreakerStates
from meteorseed_scrapy.worker.fate import Outcome
from meteorseed_scrapy.worker.pump import StreamPump
from meteorseed_scrapy.worker.signals import breaker_state_changed, task_settled
from meteorseed_scrapy.worker.work_budget import WorkSizes


class ShopSpider(Spider):
    name = "shop"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None


def make_task(n: int, site_id: str = "shop", **kwargs: Any) -> ExecTask:
    return ExecTask.create(seed_id="seed-1", site_id=site_id, url=f"https://shop.test/p/{n}",
                           **kwargs)


def _id(request: Request) -> str | None:
    task = task_of(request)
    return task.task_id if task is not None else None


def ok(request: Request, status: int = 200) -> HtmlResponse:
    return HtmlResponse(request.url, status=status, body=b"<html></html>", request=request)


class BlockingWriter(TaskWriter):
    """Writes children only once ``release`` is set (a slow Redis, seen from the pump)."""

    def __init__(self, redis: Any, keys: KeyLayout) -> None:
        super().__init__(redis, keys)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def enqueue(self, encoded: Sequence[Encoded], order: Any = None) -> AddResult:
        self.entered.set()
        await self.release.wait()
        return await super().enqueue(encoded, order)


@dataclass
class Rig:
    pump: StreamPump
    client: Any
    keys: KeyLayout
    consumer: StreamConsumer
    stats: Any
    spider: ShopSpider
    writer: TaskWriter
    settled: list[dict[str, Any]] = field(default_factory=list)
    woken: list[bool] = field(default_factory=list)
    new_urls: Counter[str] = field(default_factory=Counter)

    def on_settled(self, **kwargs: Any) -> None:
        self.settled.append(kwargs)

    async def enqueue(self, *tasks: ExecTask) -> None:
        await TaskWriter(self.client, self.keys).add(tasks, dedup=False)

    async def take(self) -> Request:
        """The next request the pump hands out (as the engine would ask, again and again)."""
        request: Request = await wait_until(self.pump.next_request, timeout=30)
        return request

    async def stream_length(self) -> int:
        return sum([int(await self.client.xlen(s)) for s in self.keys.streams])

    async def pending(self) -> int:
        total = 0
        for stream in self.keys.streams:
            with contextlib.suppress(redis.ResponseError):
                total += int((await self.client.xpending(stream, self.keys.group))["pending"])
        return total

    async def dead_reasons(self) -> list[str]:
        entries = await self.client.xrange(self.keys.dead)
        return [fields.get("reason", "") for _, fields in entries]


@contextlib.asynccontextmanager
async def pump_on(redis_url: str, namespace: str, writer: type[TaskWriter] = TaskWriter,
                  clock: Callable[[], float] = time.monotonic, **settings: Any
                  ) -> AsyncIterator[Rig]:
    crawler = get_crawler(ShopSpider, settings_dict={
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_CONSUMER": "w1", "METEORSEED_POLITENESS": False,
        "CONCURRENT_REQUESTS": 8, "METEORSEED_CLAIM_IDLE": 5, **settings,
    })
    crawler.engine = SimpleNamespace(downloader=SimpleNamespace(active=()))  # none in flight
    config = WorkerConfig.from_settings(crawler.settings)
    # As a worker crawl's runtime: the spider's own task set besides the default one (a start
    # request belongs to the crawl's spider).
    spider = worker_spider(ShopSpider.name)
    keys = KeyLayout.for_config(config).with_spiders([spider] if spider else [])
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    consumer = StreamConsumer(client, keys, config.consumer,
                              LaneWeights.from_settings(crawler.settings), spider=spider)
    limits = SiteLimits.from_settings(crawler.settings)
    gate = SiteGate(client, keys, lambda _site: limits, config.consumer, Backoff(1.0, 300.0))
    breaker = Breaker(client, keys, BreakerConfig(), crawler.stats)
    rig = Rig(None, client, keys, consumer, crawler.stats,  # type: ignore[arg-type]
              ShopSpider(), writer(client, keys))
    rig.pump = StreamPump(crawler, rig.spider, consumer, rig.writer, config,
                          gate=gate, delayed=DelayedSet(client, keys), breaker=breaker,
                          limits_for=lambda _site: limits,
                          sizes=WorkSizes.from_settings(crawler.settings),
                          politeness=crawler.settings.getbool("METEORSEED_POLITENESS"),
                          on_change=lambda: rig.woken.append(True),
                          on_new_urls=rig.new_urls.update,
                          full=RedisFull(crawler.stats), clock=clock)
    crawler.signals.connect(rig.on_settled, task_settled)
    rig.pump.start()
    try:
        yield rig
    finally:
        await rig.pump.stop(deadline_s=5)
        await client.aclose()


def run(redis_url: str, namespace: str, body: Any, **settings: Any) -> Any:
    async def main() -> Any:
        async with pump_on(redis_url, namespace, **settings) as rig:
            return await body(rig)

    return asyncio.run(main())


# -- the task's life ---------------------------------------------------------------------------


def test_a_scraped_task_is_acked_with_its_completion_record(
    redis_url: str, namespace: str
) -> None:
    task = make_task(1)

    async def body(rig: Rig) -> None:
        await rig.enqueue(task)
        request = await rig.take()
        assert _id(request) == task.task_id
        scrape = rig.pump.scrape_started(request)
        assert scrape is not None and scrape.task == task
        scrape.record_commit("shop:1", "{}")
        rig.pump.finished(request, ok(request))
        await wait_until(lambda: rig.stats.get_value("meteorseed/acked") == 1)
        assert await rig.stream_length() == 0 and await rig.pending() == 0
        [record] = await TaskRecords(rig.client, rig.keys).completion_records([task])
        assert record is not None and '"outcome":"done"' in record and '"items":1' in record
        assert [(s["task"].task_id, s["outcome"]) for s in rig.settled] == [
            (task.task_id, Outcome.DONE)]
        assert not rig.pump.has_work()

    run(redis_url, namespace, body)


def test_the_parent_is_acked_only_once_its_children_are_durable(
    redis_url: str, namespace: str
) -> None:
    parent = make_task(1)

    async def body(rig: Rig) -> None:
        writer = rig.writer
        assert isinstance(writer, BlockingWriter)
        await rig.enqueue(parent)
        request = await rig.take()
        scrape = rig.pump.scrape_started(request)
        assert rig.pump.child(scrape, Request("https://shop.test/p/2"))
        assert rig.pump.has_work()  # a child not yet written
        rig.pump.finished(request, ok(request))
        await writer.entered.wait()
        # The child is on its way to Redis: its parent may not be acked, nor even settled.
        assert rig.settled == [] and await rig.pending() == 1
        assert await TaskRecords(rig.client, rig.keys).completion_records([parent]) == [None]
        writer.release.set()
        await wait_until(lambda: rig.stats.get_value("meteorseed/acked") == 1)
        [record] = await TaskRecords(rig.client, rig.keys).completion_records([parent])
        assert record is not None and '"outcome":"done"' in record
        children = [ExecTask.from_message(f) for s in rig.keys.streams
                    for _, f in await rig.client.xrange(s)]
        assert [c.url for c in children] == ["https://shop.test/p/2"]
        assert children[0].seed_id == parent.seed_id
        assert rig.new_urls == Counter({"seed-1": 1})
        assert rig.stats.get_value("meteorseed/children/enqueued") == 1

    run(redis_url, namespace, body, writer=BlockingWriter)


def test_a_failed_scrape_stays_pending_with_its_failure_noted(
    redis_url: str, namespace: str
) -> None:
    task = make_task(1)

    async def body(rig: Rig) -> None:
        await rig.enqueue(task)
        request = await rig.take()
        scrape = rig.pump.scrape_started(request)
        assert scrape is not None
        scrape.fail("item not committed: StoreWriteError: down", transient=True)
        rig.pump.finished(request, ok(request))
        notes = await wait_until(lambda: TaskRecords(rig.client, rig.keys).failure_notes([task]))
        assert "StoreWriteError" in notes[task.task_id]
        assert await rig.pending() == 1 and not rig.stats.get_value("meteorseed/acked")
        assert rig.settled[0]["outcome"] is Outcome.FAILED

    run(redis_url, namespace, body)


def test_a_child_that_cannot_be_a_task_fails_its_parent(redis_url: str, namespace: str) -> None:
    task = make_task(1)

    async def body(rig: Rig) -> None:
        await rig.enqueue(task)
        request = await rig.take()
        scrape = rig.pump.scrape_started(request)
        bad = Request("https://shop.test/x", meta={"when": object()})
        assert rig.pump.child(scrape, bad) is False
        assert rig.stats.get_value("meteorseed/children/rejected") == 1
        rig.pump.finished(request, ok(request))
        await wait_until(lambda: rig.settled)
        assert rig.settled[0]["outcome"] is Outcome.DEAD  # it would fail the same way again
        assert "meta.when" in rig.settled[0]["reason"]
        assert "meta.when" in (await wait_until(rig.dead_reasons))[0]

    run(redis_url, namespace, body)


@pytest.mark.parametrize(("make_result", "outcome", "acked"), [
    (lambda r: ok(r, 404), Outcome.GONE, True),
    (lambda r: Failure(IgnoreRequest("robots.txt")), Outcome.IGNORED, True),
    (lambda r: ok(r, 500), Outcome.DEAD, False),
    (lambda r: Failure(TaskDeferred(60, "HTTP 503", count_retry=True)), Outcome.DEFERRED, False),
], ids=["404", "ignored", "500", "deferred"])
def test_how_a_final_hop_ends_decides_ack_dead_letter_or_deferral(
    redis_url: str, namespace: str, make_result: Any, outcome: Outcome, acked: bool
) -> None:
    task = make_task(1)

    async def body(rig: Rig) -> None:
        await rig.enqueue(task)
        request = await rig.take()
        rig.pump.scrape_started(request)
        rig.pump.finished(request, make_result(request))
        await wait_until(lambda: rig.settled)
        assert rig.settled[0]["outcome"] is outcome
        await wait_until(lambda: _not(rig.pending()))  # acked, dead-lettered or deferred
        assert bool(rig.stats.get_value("meteorseed/acked")) is acked
        if outcome is Outcome.DEAD:
            assert await rig.dead_reasons() == ["HTTP 500 after 0 retries"]
        if outcome is Outcome.DEFERRED:
            [(member, _)] = await rig.client.zrange(rig.keys.delayed, 0, -1, withscores=True)
            assert task.task_id in member

    run(redis_url, namespace, body)


def test_a_dead_letter_refused_because_another_worker_reclaimed_the_task_is_not_counted(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    task = make_task(1)
    caplog.set_level(logging.DEBUG, logger="meteorseed_scrapy")

    async def body(rig: Rig) -> None:
        await rig.enqueue(task)
        request = await rig.take()
        rig.pump.scrape_started(request)
        [stream] = [s for s in rig.keys.streams if await rig.client.xlen(s)]
        [(msg_id, _)] = await rig.client.xrange(stream)
        # Another worker reclaims it while this one is still at it.
        assert await rig.client.xclaim(stream, rig.keys.group, "w2", 0, [msg_id], justid=True)
        rig.pump.finished(request, ok(request, 500))
        await wait_until(lambda: rig.settled and not rig.pump._completions.busy())
        assert rig.settled[0]["outcome"] is Outcome.DEAD
        assert await rig.dead_reasons() == []
        assert not rig.stats.get_value("meteorseed/dead")
        assert rig.stats.get_value("meteorseed/dead/refused") == 1
        # Normal fleet behaviour after a reclaim: one INFO line naming the task, no warning.
        said = [r for r in caplog.records if "taken over by another worker" in r.getMessage()]
        assert [r.levelno for r in said if r.levelno >= logging.INFO] == [logging.INFO]
        assert task.task_id in said[-1].getMessage()
        # Still pending, on the worker that reclaimed it: its to settle.
        [entry] = await rig.client.xpending_range(stream, rig.keys.group, "-", "+", 10)
        assert entry["consumer"] == "w2"

    run(redis_url, namespace, body)


@pytest.mark.parametrize(("trouble_s", "dead"), [(10**9, True), (0.0, False)],
                         ids=["trouble-too-long", "trouble-just-began"])
def test_a_task_of_a_site_in_trouble_is_given_up_on_or_back_by_the_give_up_time(
    redis_url: str, namespace: str, trouble_s: float, dead: bool
) -> None:
    task = make_task(1)

    async def body(rig: Rig) -> None:
        breaker = rig.pump._breaker
        breaker._trouble["shop"] = (trouble_s, time.monotonic())  # as the fleet told it
        await rig.enqueue(task)
        request = await rig.take()
        rig.pump.scrape_started(request)
        rig.pump.finished(request, Failure(TaskDeferred(10**7, "sick", count_retry=False,
                                                        why=DeferReason.SICK)))
        await wait_until(lambda: _not(rig.pending()))
        if dead:
            [reason] = await rig.dead_reasons()
            assert reason.startswith("site down since ") and "86400s" in reason
            assert rig.stats.get_value("meteorseed/given_up/shop") == 1
        else:
            assert await rig.dead_reasons() == []
            [(_, due)] = await rig.client.zrange(rig.keys.delayed, 0, -1, withscores=True)
            assert due <= time.time() * 1000 + (breaker.config.give_up + 2) * 1000

    run(redis_url, namespace, body)


async def _not(value: Any) -> bool:
    return not await value


# -- hops, bad tasks, the settling cap -------------------------------------------------------


def test_a_hop_of_a_held_task_goes_out_again_and_is_no_child(
    redis_url: str, namespace: str
) -> None:
    task = make_task(1)

    async def body(rig: Rig) -> None:
        await rig.enqueue(task)
        request = await rig.take()
        redirect = request.replace(url="https://shop.test/moved")
        assert rig.pump.hop(redirect)
        assert await rig.take() is redirect
        assert not rig.pump.hop(Request("https://shop.test/none"))  # carries no task
        stranger = Request("https://shop.test/s", meta={TASK_META_KEY: make_task(9)})
        assert not rig.pump.hop(stranger)  # a task this worker does not hold
        assert not rig.stats.get_value("meteorseed/children/enqueued")

    run(redis_url, namespace, body)


def test_a_task_naming_a_missing_callback_is_dead_lettered_alone(
    redis_url: str, namespace: str
) -> None:
    bad, good = make_task(1, callback="parse_nothing"), make_task(2)

    async def body(rig: Rig) -> None:
        await rig.enqueue(bad, good)
        request = await rig.take()
        assert _id(request) == good.task_id
        reasons = await wait_until(rig.dead_reasons)
        assert len(reasons) == 1 and reasons[0].startswith("bad task: callback")
        assert rig.settled[0]["task"].task_id == bad.task_id
        assert rig.settled[0]["outcome"] is Outcome.DEAD

    run(redis_url, namespace, body)


def test_max_settling_holds_back_work_until_a_scrape_finishes(
    redis_url: str, namespace: str
) -> None:
    async def body(rig: Rig) -> None:
        await rig.enqueue(*(make_task(n) for n in range(3)))
        first, second = await rig.take(), await rig.take()
        await wait_until(lambda: rig.pump.has_work())  # the third is read, waiting
        rig.pump.scrape_started(first)
        rig.pump.scrape_started(second)
        assert rig.pump.next_request() is None  # two responses in the scraper: enough
        assert rig.pump.has_work()
        woken = len(rig.woken)
        rig.pump.finished(first, ok(first))
        assert len(rig.woken) > woken  # the engine is asked for work again
        third = rig.pump.next_request()
        assert third is not None and third.url == make_task(2).url

    run(redis_url, namespace, body, METEORSEED_MAX_SETTLING=2)


def test_with_politeness_a_request_carries_a_permit_given_back_with_its_response(
    redis_url: str, namespace: str
) -> None:
    async def body(rig: Rig) -> None:
        await rig.enqueue(make_task(1), make_task(2))
        first = await rig.take()
        assert first.meta[LEASE_META_KEY]
        rig.pump.scrape_started(first)
        assert LEASE_META_KEY not in first.meta
        second = await rig.take()  # the site's one permit came back to this worker
        assert second.meta[LEASE_META_KEY]

    run(redis_url, namespace, body, METEORSEED_POLITENESS=True, METEORSEED_SITE_CONCURRENCY=1)


# -- stopping and quiet ------------------------------------------------------------------------


def test_stop_hands_unstarted_tasks_back_for_others_at_once(
    redis_url: str, namespace: str
) -> None:
    tasks = [make_task(n) for n in range(3)]

    async def main() -> None:
        async with pump_on(redis_url, namespace) as rig:
            await rig.enqueue(*tasks)
            await wait_until(lambda: rig.stats.get_value("meteorseed/read") == 3)
            stats, client, keys = rig.stats, rig.client, rig.keys
            await rig.pump.stop(deadline_s=5)
            assert stats.get_value("meteorseed/handed_back") == 3
            other = StreamConsumer(client, keys, "w2", LaneWeights.from_settings({}))
            reclaimed = await other.reclaim(5, 10)
            assert sorted(d.task.url for d in reclaimed if d.task) == sorted(t.url for t in tasks)

    asyncio.run(main())


def test_quiet_for_starts_once_nothing_is_left_anywhere(redis_url: str, namespace: str) -> None:
    async def body(rig: Rig) -> None:
        await wait_until(lambda: rig.pump.quiet_for() is not None)
        await rig.enqueue(make_task(1))
        request = await rig.take()
        await wait_until(lambda: rig.pump.quiet_for() is None)  # a task held
        rig.pump.scrape_started(request)
        rig.pump.finished(request, ok(request))
        await wait_until(lambda: rig.pump.quiet_for() is not None)
        assert rig.stats.get_value("meteorseed/acked") == 1

    run(redis_url, namespace, body, METEORSEED_IDLE_CLOSE=1)


def test_the_quiet_clock_starts_at_the_last_ack_and_idle_close_counts_from_there(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]  # the pump's clock: moved only here

    async def main() -> None:
        async with pump_on(redis_url, namespace, clock=lambda: now[0],
                           METEORSEED_IDLE_CLOSE=2) as rig:
            await rig.enqueue(make_task(1))
            request = await rig.take()
            complete = rig.consumer.complete

            async def acked(*args: Any, **kwargs: Any) -> None:
                await complete(*args, **kwargs)
                now[0] = 200.0  # the ack is through
                # Any later reading (the look that finds the namespace quiet) sees 300.
                asyncio.get_running_loop().call_soon(now.__setitem__, 0, 300.0)

            monkeypatch.setattr(rig.consumer, "complete", acked)
            rig.pump.scrape_started(request)
            rig.pump.finished(request, ok(request))
            await wait_until(lambda: rig.pump.quiet_for() is not None)
            assert rig.stats.get_value("meteorseed/acked") == 1
            assert rig.pump.quiet_for() == 100.0  # quiet since the ack, not since the look
            now[0] = 201.5
            assert rig.pump.quiet_for() == 1.5  # < IDLE_CLOSE: the spider stays open

    asyncio.run(main())


# -- what arrives from the stream is not trusted -----------------------------------------------

FIELD = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.lists(st.dictionaries(FIELD, FIELD, min_size=1, max_size=4), min_size=1,
                        max_size=3))
def test_malformed_messages_are_dead_lettered_each_with_a_reason_and_work_goes_on(
    redis_url: str, garbage: list[dict[str, str]]
) -> None:
    good = make_task(1)
    namespace = f"t{abs(hash(repr(garbage))) % 10**12}"

    async def body(rig: Rig) -> None:
        stream = rig.keys.stream_for(good.lane, good.priority)
        for fields in garbage:
            await rig.client.xadd(stream, fields)
        await rig.enqueue(good)
        request = await rig.take()
        assert _id(request) == good.task_id
        reasons = await wait_until(
            lambda: _all_dead(rig, len(garbage)))
        assert all(reasons), reasons

    try:
        run(redis_url, namespace, body)
    finally:
        sync = redis.Redis.from_url(redis_url)
        keys = list(sync.scan_iter(f"{namespace}:*"))
        if keys:
            sync.delete(*keys)
        sync.close()


async def _all_dead(rig: Rig, n: int) -> list[str] | None:
    reasons = await rig.dead_reasons()
    return reasons if len(reasons) >= n else None


# -- breaker states ----------------------------------------------------------------------------


class Heard:
    def __init__(self) -> None:
        self.states: list[tuple[str, str]] = []

    def breaker_state_changed(self, site: str, state: str) -> None:
        self.states.append((site, state))


def test_breaker_states_are_announced_when_first_seen_and_when_they_change() -> None:
    crawler = get_crawler()
    heard = Heard()
    crawler.signals.connect(heard.breaker_state_changed, breaker_state_changed)
    class _Breaker:  # the two things BreakerStates reads of a Breaker
        state: dict[str, str] = {"news": "closed"}

        def state_of(self, site: str) -> BreakerState:
            return BreakerState(self.state[site])

    breaker = _Breaker()
    steps: list[int] = []

    async def quota_step() -> None:
        steps.append(1)

    async def main() -> None:
        watch = BreakerStates(quota_step, breaker, crawler.signals)  # type: ignore[arg-type]
        await watch.step()
        assert heard.states == [("news", "closed")] and steps == [1]
        breaker.state.update(news="open", shop="ramp")

        async def announced() -> bool:
            await watch.step()
            return len(heard.states) == 3

        await wait_until(announced)
        assert heard.states[1:] == [("news", "open"), ("shop", "ramp")]
        await watch.step()
        assert len(heard.states) == 3  # nothing changed: nothing said

    asyncio.run(main())

"""StreamScheduler wired into a stand-in engine, against a real redis-server: which scrape is
current while the scraper runs, when a task settles, hops and children, the idle signal."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from scrapy import Request, Spider, signals
from scrapy.exceptions import DontCloseSpider
from scrapy.http import HtmlResponse
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.test import get_crawler
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from meteorseed_scrapy.queue.consume.acks import TaskRecords
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.scheduler import StreamScheduler
from meteorseed_scrapy.store.base import StoreUnavailable
from meteorseed_scrapy.task.context import Scrape, current_scrape, task_of
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_until
from meteorseed_scrapy.validators import ConfigError


class ShopSpider(Spider):
    name = "shop"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None


class Engine:
    """What the scheduler uses of Scrapy's engine; the scraper's work is left to the test."""

    def __init__(self) -> None:
        self.scraper = SimpleNamespace(enqueue_scrape=self.enqueue_scrape, slot=object())
        self._slot = SimpleNamespace(nextcall=SimpleNamespace(schedule=self.wake))
        self.downloader = SimpleNamespace(active=(), middleware=SimpleNamespace(middlewares=[]))
        self.wakes = 0
        self.scrapes: list[tuple[Request, Deferred[Any], Scrape | None]] = []
        self.during_scrape: Any = None  # run while "the callback" runs

    def wake(self) -> None:
        self.wakes += 1

    def enqueue_scrape(self, result: Any, request: Request) -> Deferred[Any]:
        if self.during_scrape is not None:
            self.during_scrape()
        done: Deferred[Any] = Deferred()
        self.scrapes.append((request, done, current_scrape()))
        return done


@contextlib.asynccontextmanager
async def scheduler_on(redis_url: str, namespace: str,
                       **settings: Any) -> AsyncIterator[tuple[StreamScheduler, Engine, Any]]:
    crawler = get_crawler(ShopSpider, settings_dict={
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_CONSUMER": "w1", "METEORSEED_POLITENESS": False,
        "METEORSEED_FREEZE_GC": False, "CONCURRENT_REQUESTS": 8, **settings,
    })
    engine = Engine()
    crawler.engine = engine
    scheduler = StreamScheduler.from_crawler(crawler)
    spider = ShopSpider()
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    await maybe_deferred_to_future(scheduler.open(spider))
    try:
        yield scheduler, engine, client
    finally:
        await maybe_deferred_to_future(scheduler.close("finished"))
        assert engine.scraper.enqueue_scrape == engine.enqueue_scrape  # given back
        await client.aclose()


def make_task(n: int) -> ExecTask:
    return ExecTask.create(seed_id="seed-1", site_id="shop", url=f"https://shop.test/p/{n}")


async def take(scheduler: StreamScheduler) -> Request:
    request: Request = await wait_until(scheduler.next_request, timeout=30)
    return request


def ok(request: Request) -> HtmlResponse:
    return HtmlResponse(request.url, status=200, body=b"<html></html>", request=request)


def test_the_scrape_is_current_while_the_scraper_runs_and_the_task_acks_after_its_child(
    redis_url: str, namespace: str
) -> None:
    parent = make_task(1)

    async def main() -> None:
        async with scheduler_on(redis_url, namespace) as (scheduler, engine, client):
            keys = KeyLayout(namespace)
            await TaskWriter(client, keys).add([parent], dedup=False)
            request = await take(scheduler)
            assert scheduler.has_pending_requests() is False
            # The callback yields a link: a new task of the same seed.
            engine.during_scrape = lambda: scheduler.enqueue_request(
                Request("https://shop.test/p/2"))
            dfd = engine.scraper.enqueue_scrape(ok(request), request)
            [(_, done, scrape)] = engine.scrapes
            assert dfd is done and scrape is not None and scrape.task.task_id == parent.task_id
            assert current_scrape() is None  # only what the scraper runs sees it
            done.callback(None)
            records = TaskRecords(client, keys)
            [record] = await wait_until(lambda: _recorded(records, parent))
            assert '"outcome":"done"' in record
            stats = scheduler.stats
            assert stats.get_value("meteorseed/children/enqueued") == 1
            child = await take(scheduler)  # the child comes back as a task of its own
            assert child.url == "https://shop.test/p/2"
            assert task_of(child) is not None and task_of(child).seed_id == "seed-1"  # type: ignore[union-attr]

    asyncio.run(main())


async def _recorded(kept: TaskRecords, task: ExecTask) -> list[str] | None:
    records = await kept.completion_records([task])
    return records if all(records) else None  # type: ignore[return-value]


def test_a_redirect_of_a_held_task_is_a_hop_not_a_child(redis_url: str, namespace: str) -> None:
    async def main() -> None:
        async with scheduler_on(redis_url, namespace) as (scheduler, _, client):
            await TaskWriter(client, KeyLayout(namespace)).add([make_task(1)], dedup=False)
            request = await take(scheduler)
            moved = request.replace(url="https://shop.test/moved")
            assert scheduler.enqueue_request(moved)  # as RedirectMiddleware does
            assert scheduler.has_pending_requests()
            assert await take(scheduler) is moved
            assert not scheduler.stats.get_value("meteorseed/children/enqueued")

    asyncio.run(main())


def _raised_from(error: Exception, cause: Exception) -> Exception:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(("error", "may_pass"), [
    # what the store stage raises when the store is out of reach (StoreWriteError)
    (_raised_from(RuntimeError("not committed"), StoreUnavailable("store down")), True),
    (ConnectionRefusedError("a pipeline's own database is down"), True),
    (redis.exceptions.TimeoutError("Timeout reading from socket"), True),
    (KeyError("price"), False),  # a bug in a pipeline
], ids=["store-unavailable", "connection-refused", "redis-timeout", "bug"])
def test_an_item_error_keeps_its_task_unacked_delivered_again_only_if_it_may_pass(
    redis_url: str, namespace: str, error: Exception, may_pass: bool
) -> None:
    task = make_task(1)

    async def main() -> None:
        async with scheduler_on(redis_url, namespace) as (scheduler, engine, client):
            keys = KeyLayout(namespace)
            await TaskWriter(client, keys).add([task], dedup=False)
            request = await take(scheduler)
            crawler = scheduler.crawler
            engine.during_scrape = lambda: crawler.signals.send_catch_log(
                signals.item_error, item={}, response=None, spider=None,
                failure=Failure(error))
            engine.scraper.enqueue_scrape(ok(request), request)
            engine.scrapes[0][1].callback(None)
            reason = f"item not committed: {type(error).__name__}: "
            if may_pass:  # left pending: delivered again
                notes = await wait_until(lambda: TaskRecords(client, keys).failure_notes([task]))
                assert reason in notes[task.task_id]
                assert not await client.xlen(keys.dead)
            else:  # dead-lettered at once
                [(_, dead)] = await wait_until(lambda: client.xrange(keys.dead))
                assert dead["reason"] == reason + "'price'"
                assert not await TaskRecords(client, keys).failure_notes([task])
            assert not scheduler.stats.get_value("meteorseed/acked")

    asyncio.run(main())


def test_the_spider_stays_open_until_the_namespace_was_quiet_for_idle_close(
    redis_url: str, namespace: str
) -> None:
    def keeps_open(scheduler: StreamScheduler) -> bool:
        results = scheduler.crawler.signals.send_catch_log(signals.spider_idle, spider=None)
        return any(isinstance(r, Failure) and r.check(DontCloseSpider) for _, r in results)

    async def main() -> None:
        async with scheduler_on(redis_url, namespace, METEORSEED_IDLE_CLOSE=0.5) as (
                scheduler, _, client):
            await TaskWriter(client, KeyLayout(namespace)).add([make_task(1)], dedup=False)
            await take(scheduler)
            assert keeps_open(scheduler)  # a task is held
        async with scheduler_on(redis_url, f"{namespace}-empty",
                                METEORSEED_IDLE_CLOSE=0.5) as (scheduler, _, _):
            assert keeps_open(scheduler)
            await wait_until(lambda: not keeps_open(scheduler), timeout=30)

    asyncio.run(main())


def test_a_quiet_worker_wakes_the_engine_once_when_idle_close_is_due(
    redis_url: str, namespace: str
) -> None:
    # Each wake of an idle engine fires spider_idle: a project's handler must not run at every
    # look of the idle loop (here every 50 ms), only at Scrapy's heartbeat and once when due.
    async def main() -> None:
        async with scheduler_on(redis_url, namespace, METEORSEED_IDLE_CLOSE=0.5,
                                METEORSEED_CLAIM_IDLE=0.2) as (scheduler, engine, _):
            assert scheduler.pump is not None
            pump = scheduler.pump
            await wait_until(lambda: engine.wakes >= 1, timeout=30)
            await wait_until(lambda: (pump.quiet_for() or 0) >= 0.5 + 20 * 0.05, timeout=30)
            assert engine.wakes == 1

    asyncio.run(main())


def test_without_a_namespace_quiet_limit_the_spider_never_closes_by_itself(
    redis_url: str, namespace: str
) -> None:
    async def main() -> None:
        async with scheduler_on(redis_url, namespace) as (scheduler, _, _):
            results = scheduler.crawler.signals.send_catch_log(signals.spider_idle, spider=None)
            assert any(isinstance(r, Failure) and r.check(DontCloseSpider) for _, r in results)

    asyncio.run(main())


def test_a_finished_scrape_wakes_an_engine_that_was_refused_work(
    redis_url: str, namespace: str
) -> None:
    async def main() -> None:
        async with scheduler_on(redis_url, namespace, METEORSEED_MAX_SETTLING=2) as (
                scheduler, engine, client):
            await TaskWriter(client, KeyLayout(namespace)).add(
                [make_task(n) for n in range(3)], dedup=False)
            first, second = await take(scheduler), await take(scheduler)
            await wait_until(scheduler.has_pending_requests)
            for request in (first, second):
                engine.scraper.enqueue_scrape(ok(request), request)
            assert scheduler.next_request() is None  # two scrapes running: enough
            wakes = engine.wakes
            engine.scrapes[0][1].callback(None)
            assert engine.wakes > wakes
            third = scheduler.next_request()
            assert third is not None and third.url == "https://shop.test/p/2"

    asyncio.run(main())


def test_a_bad_work_size_setting_stops_the_scheduler_before_it_opens() -> None:
    crawler = get_crawler(ShopSpider, settings_dict={"METEORSEED_MAX_SETTLING": "lots"})
    with pytest.raises(ConfigError) as info:
        StreamScheduler.from_crawler(crawler)
    assert info.value.name == "METEORSEED_MAX_SETTLING"


def test_the_worker_sets_its_switch_interval_once_the_crawl_started_and_gives_it_back(
    redis_url: str, namespace: str
) -> None:
    before = sys.getswitchinterval()

    async def main() -> float:
        async with scheduler_on(redis_url, namespace,
                                METEORSEED_SWITCH_INTERVAL=0.0007) as (scheduler, _, _c):
            assert sys.getswitchinterval() == before  # not before the crawl starts
            scheduler.crawler.signals.send_catch_log(signals.spider_opened,
                                                     spider=ShopSpider())
            return sys.getswitchinterval()

    assert asyncio.run(main()) == pytest.approx(0.0007)
    assert sys.getswitchinterval() == pytest.approx(before)

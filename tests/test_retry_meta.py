"""Scrapy's ``dont_retry`` and ``max_retry_times`` request meta keys are honoured by the durable
retry path, and retries are counted in Scrapy's own retry stats (real Redis for the gate)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.utils.test import get_crawler
from twisted.internet.error import ConnectionRefusedError as Refused

from meteorseed_scrapy.middlewares import BackoffMiddleware, durable_retry
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.context import LEASE_META_KEY, TASK_META_KEY
from meteorseed_scrapy.task.exceptions import DeferReason, TaskDeferred
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.worker.requests import request_to_task

OPEN = SiteLimits(rate=1000.0, burst=1000, concurrency=100)
REFUSED = "twisted.internet.error.ConnectionRefusedError"


def backoff_middleware(**settings: Any) -> BackoffMiddleware:
    """The middleware of a crawler whose spider is open (not yet a worker crawl: no Redis)."""
    crawler = get_crawler(Spider, settings_dict={
        "RETRY_HTTP_CODES": [500, 503], "RETRY_EXCEPTIONS": [REFUSED], "RETRY_TIMES": 2,
        **settings})
    crawler.spider = crawler._create_spider("retry")
    return BackoffMiddleware.from_crawler(crawler)


async def outcome(redis_url: str, ns: str, meta: dict[str, Any], retry_count: int,
                  result: int | Exception) -> tuple[str, dict[str, Any]]:
    """What the middleware does with one answer: "deferred", "passed" (the response or the
    error goes on to end the task), with the stats it kept."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        mw = backoff_middleware()
        mw.runtime.gate = SiteGate(client, KeyLayout(ns), lambda _site: OPEN, "c1",
                                   Backoff(1.0, 300.0))
        mw.runtime.open_worker()
        return await answer(mw, meta, retry_count, result)
    finally:
        await client.aclose()


async def answer(mw: BackoffMiddleware, meta: dict[str, Any], retry_count: int,
                 result: int | Exception) -> tuple[str, dict[str, Any]]:
    task = replace(ExecTask.create(seed_id="s", site_id="site", url="https://a.test/1",
                                   meta=meta), retry_count=retry_count)
    request = Request(task.url, meta={**meta, TASK_META_KEY: task})
    try:
        if isinstance(result, Exception):
            await mw.process_exception(request, result)
        else:
            await mw.process_response(request, Response(task.url, status=result,
                                                        request=request))
    except TaskDeferred:
        return "deferred", mw.stats.get_stats()
    return "passed", mw.stats.get_stats()


def retry_stats(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if k.startswith("retry/")}


@pytest.mark.parametrize(("meta", "retry_count", "result", "expected", "counted"), [
    ({}, 0, 500, "deferred",
     {"retry/count": 1, "retry/reason_count/500 Internal Server Error": 1}),
    ({}, 2, 500, "passed", {"retry/max_reached": 1}),
    ({"max_retry_times": 5}, 4, 503, "deferred",
     {"retry/count": 1, "retry/reason_count/503 Service Unavailable": 1}),
    ({"max_retry_times": 0}, 0, 500, "passed", {"retry/max_reached": 1}),
    ({"dont_retry": True}, 0, 500, "passed", {}),
    ({}, 0, Refused(), "deferred", {"retry/count": 1, f"retry/reason_count/{REFUSED}": 1}),
    ({"max_retry_times": 1}, 1, Refused(), "passed", {"retry/max_reached": 1}),
    ({"dont_retry": True}, 0, Refused(), "passed", {}),
    ({}, 0, 403, "deferred", {"retry/count": 1, "retry/reason_count/403 Forbidden": 1}),
    ({"max_retry_times": 0}, 0, 403, "passed", {"retry/max_reached": 1}),
    ({"dont_retry": True}, 0, 403, "passed", {}),
    ({}, 0, 429, "deferred", {}),  # a pause uses up no retry
    ({"dont_retry": True}, 0, 429, "passed", {}),
], ids=["500", "500-used-up", "max-5", "max-0", "dont_retry-500", "refused", "refused-used-up",
        "dont_retry-refused", "403", "403-max-0", "dont_retry-403", "429", "dont_retry-429"])
def test_retry_meta_keys_decide_and_scrapy_retry_stats_count(
    redis_url: str, namespace: str, meta: dict[str, Any], retry_count: int,
    result: int | Exception, expected: str, counted: dict[str, int]
) -> None:
    done, stats = asyncio.run(outcome(redis_url, namespace, meta, retry_count, result))
    assert done == expected
    assert retry_stats(stats) == counted


def test_outside_a_worker_crawl_a_429_passes_and_a_500_is_still_decided() -> None:
    mw = backoff_middleware()  # (its runtime's Redis is never reached)
    assert asyncio.run(answer(mw, {}, 0, 429)) == ("passed", {})
    done, stats = asyncio.run(answer(mw, {}, 0, 500))
    assert done == "deferred" and retry_stats(stats) == {
        "retry/count": 1, "retry/reason_count/500 Internal Server Error": 1}


BACKOFF = Backoff(1.0, 300.0, jitter=0.0)  # (no jitter: delays compared exactly)


def spider_of(**settings: Any) -> Spider:
    crawler = get_crawler(Spider, settings_dict=settings)
    crawler.spider = crawler._create_spider("retry")
    return crawler.spider


@given(retries=st.integers(0, 12), max_retry_times=st.integers(0, 12),
       sick=st.booleans(), probe=st.booleans(), dont_retry=st.booleans())
def test_the_durable_retry_decision_without_redis(retries: int, max_retry_times: int,
                                                   sick: bool, probe: bool,
                                                   dont_retry: bool) -> None:
    spider = spider_of()
    meta: dict[str, Any] = {"dont_retry": dont_retry}
    if probe:
        meta[LEASE_META_KEY] = "lease-1:probe"
    deferred = durable_retry(Request("https://a.test/1", meta=meta), retries, "HTTP 500",
                             "500 Internal Server Error", spider=spider,
                             max_retry_times=max_retry_times, backoff=BACKOFF, site_sick=sick)
    stats = retry_stats(spider.crawler.stats.get_stats())
    if dont_retry:
        assert deferred is None and stats == {}
    elif sick or probe:  # not the task's fault: waits without using up a retry
        assert deferred is not None and not deferred.count_retry
        assert deferred.why is DeferReason.SICK and deferred.delay_s == BACKOFF.compute(0)
        assert stats == {}
    elif retries < max_retry_times:  # Scrapy's own rule, log lines and stats
        assert deferred is not None and deferred.count_retry
        assert deferred.why is DeferReason.RETRY
        assert deferred.delay_s == BACKOFF.compute(retries)
        assert deferred.reason == f"HTTP 500, retry in {deferred.delay_s:.1f}s"
        assert stats == {"retry/count": 1, "retry/reason_count/500 Internal Server Error": 1}
    else:
        assert deferred is None and stats == {"retry/max_reached": 1}


def test_counting_a_retry_needs_the_crawlers_spider() -> None:
    request = Request("https://a.test/1")
    with pytest.raises(RuntimeError, match="needs its crawler's spider"):
        durable_retry(request, 0, "HTTP 500", "500", spider=None, max_retry_times=2,
                      backoff=BACKOFF, site_sick=False)
    assert durable_retry(request, 0, "HTTP 500", "500", spider=None, max_retry_times=2,
                         backoff=BACKOFF, site_sick=True) is not None  # (no retry counted)


def test_dont_retry_still_pauses_the_site_for_a_429(redis_url: str, namespace: str) -> None:
    _, stats = asyncio.run(outcome(redis_url, namespace, {"dont_retry": True}, 0, 429))
    assert stats.get("meteorseed/throttled/site/429") == 1


@pytest.mark.parametrize(("key", "value"), [
    ("max_retry_times", -1), ("max_retry_times", 1.5), ("max_retry_times", "3"),
    ("max_retry_times", True), ("max_retry_times", 10**9), ("max_retry_times", [2]),
    ("dont_retry", "yes"), ("dont_retry", 1), ("dont_retry", {}),
])
def test_a_child_request_with_a_bad_retry_key_is_refused_with_the_key_named(
    key: str, value: Any
) -> None:
    with pytest.raises(TaskError) as caught:
        request_to_task(Request("https://a.test/", meta={key: value}), None, None)
    assert caught.value.field == f"meta.{key}"


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
                 st.lists(st.integers(), max_size=2)))
def test_max_retry_times_is_taken_only_as_a_sane_whole_number(value: Any) -> None:
    request = Request("https://a.test/", meta={"max_retry_times": value})
    sane = value is None or (type(value) is int and 0 <= value <= 1000)
    try:
        task = request_to_task(request, None, None)
    except TaskError as exc:
        assert not sane and exc.field == "meta.max_retry_times"
    else:
        assert sane and task.meta.get("max_retry_times") == value

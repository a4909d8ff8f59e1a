"""The crawl's runtime: built once per crawler and handed to every component in its
``from_crawler`` (no late binding); until the scheduler opens a worker crawl, the components
that would use Redis let every request pass and nothing connects."""

from __future__ import annotations

import asyncio
import socket

from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.middlewares import (
    AdaptiveThrottleMiddleware,
    BackoffMiddleware,
    CircuitBreakerMiddleware,
    RobotsTxtMiddleware,
)
from meteorseed_scrapy.politeness.runtime import CrawlRuntime
from meteorseed_scrapy.scheduler import StreamScheduler
from meteorseed_scrapy.task.context import TASK_META_KEY
from meteorseed_scrapy.task.exec_task import ExecTask


def closed_port() -> int:
    """A loopback port nothing listens on: a connection attempt there fails at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def crawler_for(redis_url: str) -> object:
    crawler = get_crawler(Spider, settings_dict={"METEORSEED_REDIS_URL": redis_url,
                                                 "ROBOTSTXT_OBEY": True})
    crawler.spider = crawler._create_spider("runtime")
    return crawler


def test_every_component_gets_the_one_runtime_of_its_crawler() -> None:
    crawler = crawler_for(f"redis://127.0.0.1:{closed_port()}/0")
    other = crawler_for(f"redis://127.0.0.1:{closed_port()}/0")
    runtime = CrawlRuntime.of(crawler)
    components = [cls.from_crawler(crawler) for cls in (
        BackoffMiddleware, CircuitBreakerMiddleware, AdaptiveThrottleMiddleware,
        RobotsTxtMiddleware, StreamScheduler)]
    assert all(c.runtime is runtime for c in components)
    assert CrawlRuntime.of(other) is not runtime
    assert runtime.worker is False
    assert runtime.writer is runtime.writer  # (built once, when first needed)


def test_outside_a_worker_crawl_the_middlewares_pass_and_nothing_connects() -> None:
    crawler = crawler_for(f"redis://127.0.0.1:{closed_port()}/0")
    task = ExecTask.create(seed_id="s", site_id="site", url="https://a.test/1")
    request = Request(task.url, meta={TASK_META_KEY: task, "download_latency": 0.1})
    throttled = Response(task.url, status=429, request=request)
    backoff = BackoffMiddleware.from_crawler(crawler)
    breaker = CircuitBreakerMiddleware.from_crawler(crawler)
    adaptive = AdaptiveThrottleMiddleware.from_crawler(crawler)

    async def answers() -> list[Response]:
        # (a gate call would try the closed port and raise a ConnectionError)
        return [await backoff.process_response(request, throttled),
                breaker.process_response(request, throttled),
                adaptive.process_response(request, throttled)]

    assert asyncio.run(answers()) == [throttled] * 3
    runtime = CrawlRuntime.of(crawler)
    assert runtime.breaker.state == {} and not runtime.gate.samples.take()

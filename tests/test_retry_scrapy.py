"""The durable retries decide, log and count as Scrapy's RetryMiddleware does: the cases of
Scrapy's tests/test_downloadermiddleware_retry.py that apply (a retry here is a TaskDeferred
that puts the task back for later, not a new Request). No Redis: the decision needs none."""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import replace
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.http import Response
from scrapy.utils.test import get_crawler
from twisted.internet.error import ConnectError, ConnectionDone, ConnectionLost

from meteorseed_scrapy.middlewares import BackoffMiddleware
from meteorseed_scrapy.task.context import TASK_META_KEY
from meteorseed_scrapy.task.exceptions import TaskDeferred
from meteorseed_scrapy.task.exec_task import ExecTask

try:  # Scrapy 2.15+ raises its own for a download's timeout and a refused connection
    from scrapy.exceptions import DownloadConnectionRefusedError, DownloadTimeoutError
except ImportError:  # 2.14 (setup.cfg's floor) raises Twisted's
    from twisted.internet.error import ConnectionRefusedError as DownloadConnectionRefusedError
    from twisted.internet.error import TimeoutError as DownloadTimeoutError

RETRY_LOGGER = "scrapy.downloadermiddlewares.retry"
RETRY_PARAMETERS = inspect.signature(get_retry_request).parameters


def middleware(**settings: Any) -> BackoffMiddleware:
    crawler = get_crawler(Spider, settings_dict=settings)
    crawler.spider = crawler._create_spider("retry")
    return BackoffMiddleware.from_crawler(crawler)


def attempt(mw: BackoffMiddleware, url: str, retries: int, result: int | Exception,
            **meta: Any) -> bool:
    """Whether the task's ``retries``-th retry failing with ``result`` is retried again."""
    task = replace(ExecTask.create(seed_id="s", site_id="site", url=url), retry_count=retries)
    request = Request(url, meta={**meta, TASK_META_KEY: task})
    try:
        if isinstance(result, Exception):
            asyncio.run(mw.process_exception(request, result))
        else:
            asyncio.run(mw.process_response(request, Response(url, status=result,
                                                              request=request)))
    except TaskDeferred as deferred:
        assert deferred.count_retry
        return True
    return False


def test_503_is_retried_twice_then_given_up_with_scrapys_log_lines_and_stats(
    caplog: pytest.LogCaptureFixture
) -> None:
    mw = middleware()
    url = "http://www.scrapytest.org/503"
    with caplog.at_level(logging.DEBUG, RETRY_LOGGER):
        assert [attempt(mw, url, n, 503) for n in range(3)] == [True, True, False]
    assert [r for r in caplog.record_tuples if r[0] == RETRY_LOGGER] == [
        (RETRY_LOGGER, logging.DEBUG,
         f"Retrying <GET {url}> (failed 1 times): 503 Service Unavailable"),
        (RETRY_LOGGER, logging.DEBUG,
         f"Retrying <GET {url}> (failed 2 times): 503 Service Unavailable"),
        (RETRY_LOGGER, logging.ERROR,
         f"Gave up retrying <GET {url}> (failed 3 times): 503 Service Unavailable"),
    ]
    stats = mw.stats
    assert stats.get_value("retry/max_reached") == 1
    assert stats.get_value("retry/reason_count/503 Service Unavailable") == 2
    assert stats.get_value("retry/count") == 2


def test_404_and_dont_retry_are_not_retried() -> None:
    mw = middleware()
    assert not attempt(mw, "http://www.scrapytest.org/404", 0, 404)
    assert not attempt(mw, "http://www.scrapytest.org/503", 0, 503, dont_retry=True)
    assert not attempt(mw, "http://www.scrapytest.org/x", 0, ConnectionLost("foo"),
                       dont_retry=True)
    assert mw.stats.get_value("retry/count") is None


@pytest.mark.parametrize("exc", [ConnectError, ConnectionDone, ConnectionLost,
                                 DownloadTimeoutError, DownloadConnectionRefusedError])
def test_network_errors_are_retried_and_counted_by_their_full_name(exc: type) -> None:
    mw = middleware()
    url = f"http://www.scrapytest.org/{exc.__name__}"
    assert [attempt(mw, url, n, exc("foo")) for n in range(3)] == [True, True, False]
    name = f"{exc.__module__}.{exc.__qualname__}"
    assert mw.stats.get_value(f"retry/reason_count/{name}") == 2
    assert mw.stats.get_value("retry/max_reached") == 1


def test_an_exception_added_to_retry_exceptions_is_retried() -> None:
    mw = middleware(RETRY_EXCEPTIONS=["builtins.ValueError"])
    assert attempt(mw, "http://www.scrapytest.org/ValueError", 0, ValueError("foo"))


def test_retry_http_codes_and_retry_times_are_the_settings() -> None:
    mw = middleware(RETRY_HTTP_CODES=[418], RETRY_TIMES=1)
    assert [attempt(mw, "http://a.test/teapot", n, 418) for n in range(2)] == [True, False]
    assert not attempt(mw, "http://a.test/503", 0, 503)


@pytest.mark.parametrize(("setting", "meta", "retried"), [
    (0, None, [False]),  # test_with_settings_zero
    (2, 0, [False]),  # test_with_metakey_zero
    (2, None, [True, True, False]),  # test_without_metakey
    (2, 4, [True, True, True, True, False]),  # test_with_metakey_greater
    (4, 2, [True, True, False]),  # test_with_metakey_lesser
])
def test_max_retry_times_meta_wins_over_retry_times(
    setting: int, meta: int | None, retried: list[bool]
) -> None:
    mw = middleware(RETRY_TIMES=setting)
    extra = {} if meta is None else {"max_retry_times": meta}
    assert [attempt(mw, "http://www.scrapytest.org/invalid_url", n, DownloadTimeoutError(),
                    **extra) for n in range(len(retried))] == retried


def test_the_give_up_log_level_follows_the_setting_and_the_meta_key(
    caplog: pytest.LogCaptureFixture
) -> None:
    url = "http://example.com/503"
    gave_up = f"Gave up retrying <GET {url}> (failed 1 times): 503 Service Unavailable"
    with caplog.at_level(logging.DEBUG, RETRY_LOGGER):
        attempt(middleware(RETRY_TIMES=0, RETRY_GIVE_UP_LOG_LEVEL="WARNING"), url, 0, 503)
        attempt(middleware(RETRY_TIMES=0), url, 0, 503, give_up_log_level="INFO")
    # (as Scrapy's RetryMiddleware: 2.14 knows neither and gives up at ERROR)
    levels = ([logging.WARNING, logging.INFO] if "give_up_log_level" in RETRY_PARAMETERS
              else [logging.ERROR, logging.ERROR])
    assert [(level, msg) for name, level, msg in caplog.record_tuples
            if name == RETRY_LOGGER] == [(level, gave_up) for level in levels]

"""Tracing filter, JSON formatter, queue sampler and the metrics collector, in process."""

from __future__ import annotations

import ast
import asyncio
import io
import json
import logging
import time
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.observability import metrics
from meteorseed_scrapy.observability.logging import JsonFormatter, TaskContextFilter
from meteorseed_scrapy.observability.metrics import MetricsExtension, StatsCollector
from meteorseed_scrapy.observability.site_series import SiteSeries
from meteorseed_scrapy.queue.inspect.status import QueueSampler
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.context import CURRENT_SCRAPE, TASK_META_KEY, Scrape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.fate import Outcome
from meteorseed_scrapy.worker.signals import breaker_state_changed, task_settled


def _record(msg: str = "hello %s", args: object = ("world",), **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("some.logger", logging.INFO, __file__, 1, msg, args, None)  # type: ignore[arg-type]
    record.__dict__.update(extra)
    return record


def _task(**kw: object) -> ExecTask:
    return ExecTask.create(seed_id="seed-7", site_id="s", url="https://example.com/a", **kw)


def test_filter_takes_ids_from_the_running_scrape() -> None:
    task = _task()
    token = CURRENT_SCRAPE.set(Scrape(task))
    try:
        record = _record()
        assert TaskContextFilter().filter(record)
    finally:
        CURRENT_SCRAPE.reset(token)
    assert (record.seed_id, record.task_id) == ("seed-7", task.task_id)  # type: ignore[attr-defined]


def test_filter_takes_ids_from_a_request_argument_and_keeps_extra() -> None:
    task = _task()
    request = Request(task.url, meta={TASK_META_KEY: task})
    record = _record("Crawled %(request)s", ({"request": request},))
    TaskContextFilter().filter(record)
    assert record.task_id == task.task_id  # type: ignore[attr-defined]
    assert record.seed_id == "seed-7"  # type: ignore[attr-defined]

    explicit = _record(task_id="t-x", seed_id="s-x")
    TaskContextFilter().filter(explicit)
    assert (explicit.seed_id, explicit.task_id) == ("s-x", "t-x")  # type: ignore[attr-defined]

    unrelated = _record()
    TaskContextFilter().filter(unrelated)
    assert (unrelated.seed_id, unrelated.task_id) == (None, None)  # type: ignore[attr-defined]


def test_json_formatter_writes_one_object_per_line() -> None:
    record = _record("multi\nline %s", ("msg",), task_id="t1", seed_id="s1")
    try:
        raise ValueError("bad")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "multi\nline msg"
    assert (doc["level"], doc["logger"], doc["task_id"], doc["seed_id"]) == (
        "INFO", "some.logger", "t1", "s1")
    assert doc["time"].endswith("+00:00")
    assert "ValueError: bad" in doc["exception"]
    bare = json.loads(JsonFormatter().format(_record()))
    assert "task_id" not in bare and "seed_id" not in bare


def test_json_formatter_keeps_every_extra_field() -> None:
    """What a caller passes as ``extra=`` reaches the line; the record's own attributes do not."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(TaskContextFilter())
    logger = logging.getLogger("meteorseed.test.json_extra")
    logger.addHandler(handler)
    logger.propagate = False
    spider = Spider("shop")
    try:
        logger.warning("gave up on %s", "a", extra={
            "site_id": "news", "url": "https://news.test/a", "consumer": "w1", "task_id": "t9",
            "seed_id": "s9", "attempts": 3, "path": Path("/x"), "spider": spider,
            "level": "spoof", "skipped": None})
    finally:
        logger.removeHandler(handler)
    doc = json.loads(stream.getvalue())
    assert doc.pop("time")
    assert doc == {"level": "WARNING", "logger": "meteorseed.test.json_extra",
                   "message": "gave up on a", "site_id": "news", "url": "https://news.test/a",
                   "consumer": "w1", "task_id": "t9", "seed_id": "s9", "attempts": 3,
                   "path": "/x", "spider": "shop"}


def test_metrics_extension_is_off_without_a_port() -> None:
    with pytest.raises(NotConfigured):
        MetricsExtension.from_crawler(get_crawler(settings_dict={}))
    with pytest.raises(ConfigError, match="METEORSEED_METRICS_PORT"):  # invalid: not "off"
        MetricsExtension.from_crawler(get_crawler(settings_dict={"METEORSEED_METRICS_PORT": "x"}))


def test_stats_collector_exposes_outcomes_and_per_site_counters() -> None:
    stats = {"meteorseed/outcome/done": 7, "meteorseed/outcome/dead": 1,
             "meteorseed/retry/news/http_503": 3, "meteorseed/throttled/news/429": 2,
             "meteorseed/breaker/news/open": 1}

    class Stats:
        def get_stats(self) -> dict[str, int]:
            return stats

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(Stats(), SiteSeries(Stats(), 10)))
    text = generate_latest(registry).decode()
    assert 'meteorseed_tasks_total{outcome="done"} 7.0' in text
    assert 'meteorseed_tasks_total{outcome="failed"} 0.0' in text
    assert 'meteorseed_site_retries_total{reason="http_503",site="news"} 3.0' in text
    assert 'meteorseed_site_throttled_total{site="news",status="429"} 2.0' in text
    assert 'meteorseed_site_breaker_transitions_total{site="news",state="open"} 1.0' in text


def test_metrics_follow_the_worker_signals_not_its_objects() -> None:
    crawler = get_crawler(settings_dict={"METEORSEED_METRICS_PORT": 9})  # no server until open
    ext = MetricsExtension.from_crawler(crawler)
    text = generate_latest(ext.registry).decode()
    assert "# TYPE meteorseed_site_breaker_state gauge" in text  # listed before any site
    assert "meteorseed_ingest_latency_seconds_count 0.0" in text

    created = _task(created_at=time.time() - 30)
    for outcome in Outcome:  # only committed tasks count towards ingest latency
        crawler.signals.send_catch_log(task_settled, task=created, outcome=outcome, reason="")
    crawler.signals.send_catch_log(task_settled, task=_task(created_at=0), outcome=Outcome.DONE,
                                   reason="")  # no creation time: not observed
    for site, state in (("news", "open"), ("shop", "open"), ("shop", "ramp"),
                        ("blog", "closed"), ("odd", "unheard-of")):
        crawler.signals.send_catch_log(breaker_state_changed, site=site, state=state)
    text = generate_latest(ext.registry).decode()
    assert "meteorseed_ingest_latency_seconds_count 3.0" in text
    assert 'meteorseed_ingest_latency_seconds_bucket{le="10.0"} 0.0' in text
    assert 'meteorseed_ingest_latency_seconds_bucket{le="60.0"} 3.0' in text
    assert 'meteorseed_site_breaker_state{site="news"} 2.0' in text
    assert 'meteorseed_site_breaker_state{site="shop"} 1.0' in text
    assert 'meteorseed_site_breaker_state{site="blog"} 0.0' in text
    assert 'meteorseed_site_breaker_state{site="odd"} -1.0' in text


def test_metrics_import_no_worker_internals() -> None:
    tree = ast.parse(Path(metrics.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
    worker = {name for name in imported if name and name.startswith("meteorseed_scrapy.worker")}
    assert worker == {"meteorseed_scrapy.worker.fate", "meteorseed_scrapy.worker.signals"}


def test_queue_sampler_reads_backlog_pending_lag_and_consumers(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)
    sync_redis.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
    for i in range(1, 6):  # ids from 1970: the oldest waiting one is decades old
        sync_redis.xadd(keys.stream, {"v": "1"}, id=f"{i}000-0")
    sync_redis.xreadgroup(keys.group, "c1", {keys.stream: ">"}, count=2)

    async def run() -> object:
        sampler = QueueSampler(redis_url, keys)
        try:
            return await sampler.sample()
        finally:
            await sampler.close()

    sample = asyncio.run(run())
    assert (sample.length, sample.pending, sample.backlog) == (5, 2, 3)  # type: ignore[attr-defined]
    assert sample.lag_s > 50 * 365 * 86400  # type: ignore[attr-defined]  # the 3000-0 entry
    assert [(c.name, c.pending) for c in sample.consumers] == [("c1", 2)]  # type: ignore[attr-defined]

    sync_redis.xreadgroup(keys.group, "c2", {keys.stream: ">"}, count=10)
    drained = asyncio.run(run())
    assert (drained.backlog, drained.lag_s) == (0, 0.0)  # type: ignore[attr-defined]


def test_queue_sampler_without_a_stream(redis_url: str, namespace: str) -> None:
    async def run() -> object:
        sampler = QueueSampler(redis_url, KeyLayout(namespace))
        try:
            return await sampler.sample()
        finally:
            await sampler.close()

    sample = asyncio.run(run())
    assert (sample.length, sample.backlog, sample.consumers) == (0, 0, ())  # type: ignore[attr-defined]

"""Migrating scrapy-redis queues and start URLs, written by the real scrapy_redis package, into
the task stream (real Redis)."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from scrapy import FormRequest, Request, Spider
from scrapy.http import JsonRequest, XmlRpcRequest
from scrapy_redis.queue import FifoQueue, LifoQueue, PriorityQueue

from meteorseed_scrapy.migrate.convert import Origin
from meteorseed_scrapy.migrate.scrapy_redis import (
    MigrationSummary,
    RefusedEntry,
    ScrapyRedisSource,
    migrate,
)
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.lanes import BANDS, band_of
from meteorseed_scrapy.worker.requests import task_to_request


class ShopSpider(Spider):
    name = "shop"

    def parse_product(self, response: Any) -> None: ...

    def on_error(self, failure: Any) -> None: ...


@pytest.fixture
def raw_redis(redis_url: str) -> Any:
    client = redis.Redis.from_url(redis_url)  # bytes, as scrapy-redis's own client
    yield client
    client.close()


def source_for(namespace: str, lifo: bool = False) -> ScrapyRedisSource:
    # The spider is named after the test's namespace so the fixture cleans its keys up.
    return ScrapyRedisSource(namespace, f"{namespace}:requests", f"{namespace}:start_urls", lifo)


def run(redis_url: str, namespace: str, source: ScrapyRedisSource, **kwargs: Any
        ) -> tuple[MigrationSummary, list[RefusedEntry]]:
    rejections: list[RefusedEntry] = []

    async def main() -> MigrationSummary:
        client = aioredis.Redis.from_url(redis_url)
        try:
            writer = TaskWriter(client, KeyLayout(namespace))
            return await migrate(client, writer, source, Origin(namespace, "migrated"),
                                 on_reject=rejections.append, **kwargs)
        finally:
            await client.aclose()

    return asyncio.run(main()), rejections


def stream_tasks(sync_redis: redis.Redis, namespace: str) -> list[ExecTask]:
    """Every task of every stream, in the order workers prefer them (priority bands first)."""
    entries: Any = [e for s in KeyLayout(namespace).streams for e in sync_redis.xrange(s)]
    return [ExecTask.from_message(fields) for _, fields in entries]


def requests_for(spider: ShopSpider) -> list[Request]:
    return [
        Request("https://shop.example/p/1", callback=spider.parse_product, priority=3,
                meta={"sku": "A-1", "tags": ["x", 2], "when": {1, 2}, "download_slot": "s",
                      "retry_times": 1},
                headers={"X-Token": "abc"}, cb_kwargs={"page": 1}),
        Request("https://shop.example/search", method="POST", body=b'{"q": "lamp"}',
                headers={"Content-Type": "application/json"}, errback=spider.on_error,
                priority=-1),
        FormRequest("https://shop.example/login", formdata={"user": "u"}, priority=7),
    ]


@pytest.mark.parametrize("queue_cls", [FifoQueue, LifoQueue, PriorityQueue])
def test_queue_of_each_kind(queue_cls: Any, raw_redis: redis.Redis, sync_redis: redis.Redis,
                            redis_url: str, namespace: str) -> None:
    spider = ShopSpider(name=namespace)
    queue = queue_cls(raw_redis, spider, "%(spider)s:requests")
    for request in requests_for(spider):
        queue.push(request)
    source = source_for(namespace, lifo=queue_cls is LifoQueue)
    summary, rejections = run(redis_url, namespace, source)

    assert rejections == []
    assert (summary.requests, summary.enqueued, summary.rejected) == (3, 3, 0)
    assert summary.meta_dropped == 1  # "when" is a set
    tasks = stream_tasks(sync_redis, namespace)
    by_url = {t.url: t for t in tasks}
    product = by_url["https://shop.example/p/1"]
    assert product.callback == "parse_product"
    assert product.priority == 3
    # no set, no retry count; the spider's slot kept
    assert dict(product.meta) == {"sku": "A-1", "tags": ["x", 2], "download_slot": "s"}
    assert dict(product.cb_kwargs) == {"page": 1}
    assert product.headers["X-Token"] == ["abc"]
    assert (product.site_id, product.seed_id) == (namespace, "migrated")
    search = by_url["https://shop.example/search"]
    assert (search.method, search.body, search.errback) == ("POST", '{"q": "lamp"}', "on_error")
    assert search.callback is None and search.priority == -1
    login = by_url["https://shop.example/login"]
    assert (login.method, login.body) == ("POST", "user=u")
    assert login.headers["Content-Type"] == ["application/x-www-form-urlencoded"]
    # The streams hold them in the order scrapy-redis would have popped them, within each
    # priority band (bands go strictly by priority, even for scrapy-redis's FIFO/LIFO queues).
    popped = []
    while (request := queue.pop()) is not None:
        popped.append(request.url)
    rank = {t.url: BANDS.index(band_of(t.priority)) for t in tasks}
    assert [t.url for t in tasks] == sorted(popped, key=rank.__getitem__)
    assert len(queue) == 0  # popping above, not the migration, emptied the source


def _rich_requests(spider: ShopSpider) -> list[Request]:
    """Requests using every field of ``Request.to_dict()`` that a task can carry."""
    return [
        Request("https://shop.example/c", cookies={"session": "s1", "n": 3},
                flags=["from-hub"], dont_filter=True, encoding="cp1251",
                callback=spider.parse_product, cb_kwargs={"page": 2}, priority=4),
        Request("https://shop.example/l", cookies=[{"name": "a", "value": "b",
                                                   "domain": "shop.example"}]),
        Request("https://shop.example/bin", method="PUT", body=b"\xff\x00\x81 raw bytes"),
        FormRequest("https://shop.example/f", formdata={"q": "лампа"}, encoding="cp1251"),
        JsonRequest("https://shop.example/j", data={"q": "lamp"},
                    dumps_kwargs={"sort_keys": True}),
        XmlRpcRequest("https://shop.example/rpc", params=("a",), methodname="find"),
    ]


def test_every_field_a_task_can_carry_survives_the_migration(
        raw_redis: redis.Redis, sync_redis: redis.Redis, redis_url: str,
        namespace: str) -> None:
    # The oracle is Scrapy's own Request.to_dict(): of the request pushed, and of the one a
    # worker rebuilds from the migrated task (meta aside: the task rides in it).
    spider = ShopSpider(name=namespace)
    queue = FifoQueue(raw_redis, spider, "%(spider)s:requests")
    pushed = _rich_requests(spider)
    for request in pushed:
        queue.push(request)
    summary, rejections = run(redis_url, namespace, source_for(namespace))

    assert rejections == [] and summary.enqueued == len(pushed)
    rebuilt = {r.url: r for r in (task_to_request(t, spider)
                                  for t in stream_tasks(sync_redis, namespace))}
    for request in pushed:
        again = rebuilt[request.url]
        assert type(again) is type(request)
        want, got = request.to_dict(spider=spider), again.to_dict(spider=spider)
        want.pop("meta"), got.pop("meta")
        assert got == want, request.url


@pytest.mark.parametrize("kind", ["list", "set", "zset"])
def test_start_urls_of_each_type(kind: str, raw_redis: redis.Redis, sync_redis: redis.Redis,
                                 redis_url: str, namespace: str) -> None:
    key = f"{namespace}:start_urls"
    payloads = [
        "https://news.example/a",
        json.dumps({"url": "https://news.example/b", "meta": {"job": "j1"}}),
        json.dumps({"url": "https://news.example/c", "method": "post", "q": "rain"}),
        json.dumps({"url": "https://news.example/d", "page": "2"}),  # GET: formdata -> query
    ]
    for score, payload in enumerate(payloads):
        if kind == "list":
            raw_redis.rpush(key, payload)
        elif kind == "set":
            raw_redis.sadd(key, payload)
        else:
            raw_redis.zadd(key, {payload: score * 10})
    summary, rejections = run(redis_url, namespace, source_for(namespace))

    assert rejections == []
    assert (summary.start_urls, summary.enqueued) == (4, 4)
    by_url = {t.url: t for t in stream_tasks(sync_redis, namespace)}
    assert set(by_url) == {"https://news.example/a", "https://news.example/b",
                           "https://news.example/c", "https://news.example/d?page=2"}
    assert dict(by_url["https://news.example/b"].meta) == {"job": "j1"}
    post = by_url["https://news.example/c"]
    assert (post.method, post.body) == ("POST", "q=rain")
    assert all(t.callback is None for t in by_url.values())
    if kind == "zset":
        assert by_url["https://news.example/d?page=2"].priority == 30  # score kept as priority
    assert raw_redis.exists(key)  # no --move: the source is untouched


def test_move_empties_the_source_and_keeps_rejected(
        raw_redis: redis.Redis, sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    spider = ShopSpider(name=namespace)
    queue = FifoQueue(raw_redis, spider, "%(spider)s:requests")
    for i in range(25):
        queue.push(Request(f"https://shop.example/p/{i}", callback=spider.parse_product))
    queue.push(Request("https://shop.example/p/3"))  # a duplicate
    queue.push(Request("https://shop.example/p/4", dont_filter=True))  # scheduled again
    bad = pickle.dumps({"url": "https://shop.example/x", "_class": "myproject.SplashRequest"},
                       protocol=-1)
    raw_redis.lpush(f"{namespace}:requests", bad)
    # A start URL is dont_filter in scrapy-redis (RedisSpider.make_request_from_data): kept
    raw_redis.lpush(f"{namespace}:start_urls", "https://shop.example/p/3", "not a url")
    summary, rejections = run(redis_url, namespace, source_for(namespace), move=True,
                              batch_size=4)

    assert (summary.enqueued, summary.duplicates, summary.rejected) == (27, 1, 2)
    assert summary.removed == 28  # the duplicate too: its task is on the stream
    assert sorted(r.reason for r in rejections)[0].startswith("_class: 'myproject.SplashRequest'")
    assert raw_redis.lrange(f"{namespace}:requests", 0, -1) == [bad]
    assert raw_redis.lrange(f"{namespace}:start_urls", 0, -1) == [b"not a url"]
    tasks = stream_tasks(sync_redis, namespace)
    assert len(tasks) == 27
    assert sorted(t.url for t in tasks if t.dont_filter) == [
        "https://shop.example/p/3", "https://shop.example/p/4"]


@pytest.mark.parametrize("queue_cls", [PriorityQueue, LifoQueue])
def test_move_other_kinds(queue_cls: Any, raw_redis: redis.Redis, sync_redis: redis.Redis,
                          redis_url: str, namespace: str) -> None:
    spider = ShopSpider(name=namespace)
    queue = queue_cls(raw_redis, spider, "%(spider)s:requests")
    for i in range(10):
        queue.push(Request(f"https://shop.example/p/{i}", priority=i))
    raw_redis.sadd(f"{namespace}:start_urls", *[f"https://shop.example/s/{i}" for i in range(7)])
    summary, _ = run(redis_url, namespace, source_for(namespace), move=True, batch_size=3)

    assert (summary.enqueued, summary.removed) == (17, 17)
    assert not raw_redis.exists(f"{namespace}:requests", f"{namespace}:start_urls")
    assert len(stream_tasks(sync_redis, namespace)) == 17


def test_dry_run_writes_nothing(raw_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    spider = ShopSpider(name=namespace)
    queue = PriorityQueue(raw_redis, spider, "%(spider)s:requests")
    for request in requests_for(spider):
        queue.push(request)
    raw_redis.sadd(f"{namespace}:start_urls", "https://shop.example/", "ftp://nope")
    before = {key: raw_redis.dump(key) for key in raw_redis.scan_iter(f"{namespace}:*")}
    summary, rejections = run(redis_url, namespace, source_for(namespace), dry_run=True)

    assert (summary.requests, summary.start_urls, summary.rejected) == (3, 2, 1)
    assert str(summary).startswith("dry run: read 5 entries")
    assert [r.key for r in rejections] == [f"{namespace}:start_urls"]
    after = {key: raw_redis.dump(key) for key in raw_redis.scan_iter(f"{namespace}:*")}
    assert after == before  # no stream, no dedup set, sources unchanged


class _Evil:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_malicious_pickle_is_rejected_not_run(
        protocol: int, tmp_path: Path, raw_redis: redis.Redis, sync_redis: redis.Redis,
        redis_url: str, namespace: str) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"url": "https://shop.example/", "meta": {"x": _Evil(marker)}},
                           protocol=protocol)
    assert pickle.loads(payload) == {"url": "https://shop.example/", "meta": {"x": 0}}
    assert marker.exists()  # the payload really runs code when unpickled normally
    marker.unlink()
    spider = ShopSpider(name=namespace)
    FifoQueue(raw_redis, spider, "%(spider)s:requests").push(Request("https://shop.example/ok"))
    raw_redis.lpush(f"{namespace}:requests", payload)
    summary, rejections = run(redis_url, namespace, source_for(namespace), move=True)

    assert not marker.exists()
    assert (summary.enqueued, summary.rejected) == (1, 1)
    assert "system" in rejections[0].reason and "never classes or functions" in rejections[0].reason
    assert raw_redis.lrange(f"{namespace}:requests", 0, -1) == [payload]  # left for inspection
    assert [t.url for t in stream_tasks(sync_redis, namespace)] == ["https://shop.example/ok"]

"""One namespace, one store (issue 22.3): the store's identity is recorded per namespace and a
worker with another is refused at its start, as one with another shard count is. Real Redis,
real `scrapy crawl` workers."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import redis
from scrapy.settings import Settings

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.store.identity import check_store_identity, store_identity
from meteorseed_scrapy.testing.sites import DemoSite
from meteorseed_scrapy.validators import ConfigError
from tests.e2e_helpers import enqueue, start_worker, stored_docs

PIPELINES = {"ITEM_PIPELINES": {"meteorseed_scrapy.pipelines.UpsertPipeline": 900}}


def test_the_identity_leaves_out_credentials_and_options_and_sorts_hosts() -> None:
    a = store_identity("mongodb://user:s3cret@B.example:27017,a.example:27017/items?tls=true")
    b = store_identity("mongodb://a.example:27017,b.example:27017/items")
    assert a == b == "mongodb://a.example:27017,b.example:27017/items"
    assert "s3cret" not in a
    assert store_identity("mongodb://h/") == "mongodb://h/meteorseed"


def test_a_relative_sqlite_path_is_the_file_it_names_from_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert store_identity("sqlite:///items.db") == f"sqlite:///{tmp_path.resolve()}/items.db"
    assert store_identity(f"sqlite:///{tmp_path}/./items.db") == \
        store_identity("sqlite:///items.db")


def check(redis_url: str, namespace: str, uri: str, **extra: object) -> None:
    settings = Settings({**PIPELINES, "METEORSEED_STORE_URI": uri, **extra})

    async def main() -> None:
        client = async_client(redis_url, decode_responses=True)
        try:
            await check_store_identity(client, KeyLayout(namespace), settings)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_the_first_store_is_recorded_and_another_is_refused_naming_the_setting(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    check(redis_url, namespace, f"sqlite:///{tmp_path}/a.db")
    assert sync_redis.get(KeyLayout(namespace).store) == f"sqlite:///{tmp_path}/a.db"
    check(redis_url, namespace, f"sqlite:///{tmp_path}/../{tmp_path.name}/a.db")  # the same
    with pytest.raises(ConfigError, match="METEORSEED_STORE_URI") as caught:
        check(redis_url, namespace, f"sqlite:///{tmp_path}/b.db")
    assert "split between two stores" in str(caught.value)
    with pytest.raises(ConfigError, match="METEORSEED_STORE_URI") as caught:
        check(redis_url, namespace, "mongodb://user:pw@db.example/items")
    assert "pw" not in str(caught.value).replace(KeyLayout(namespace).store, "")


def test_a_crawl_that_stores_no_items_here_records_nothing(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    check(redis_url, namespace, "sqlite:///x.db", ITEM_PIPELINES={})
    assert sync_redis.get(KeyLayout(namespace).store) is None


def test_a_second_worker_with_another_store_file_is_refused_at_its_start(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite,
) -> None:
    keys = KeyLayout(namespace)
    enqueue(redis_url, namespace, [f"{demo_site.url}/shop/product/{i}" for i in range(1, 6)])
    first = start_worker(tmp_path, redis_url, namespace, name="w1", store=tmp_path / "a.db")
    assert first.wait(120) == 0, first.log()[-3000:]
    assert len(stored_docs(tmp_path / "a.db")) == 5
    enqueue(redis_url, namespace, [f"{demo_site.url}/shop/product/{i}" for i in range(6, 11)])
    second = start_worker(tmp_path, redis_url, namespace, name="w2", store=tmp_path / "b.db")
    assert second.wait(120) == 1, second.log()[-3000:]
    log = second.log()
    assert "METEORSEED_STORE_URI" in log and "split between two stores" in log
    assert not os.path.exists(tmp_path / "b.db") or stored_docs(tmp_path / "b.db") == {}
    assert sync_redis.xlen(keys.stream) == 5  # nothing taken, nothing acked

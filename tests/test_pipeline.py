"""UpsertPipeline driven directly on an asyncio loop, the way Scrapy's asyncio reactor runs it."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.exceptions import ScrapyDeprecationWarning
from scrapy.pipelines import ItemPipelineManager
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.pipelines import StoreWriteError, UpsertPipeline
from meteorseed_scrapy.settings import StoreConfig
from meteorseed_scrapy.store.base import Store, StoreUnavailable
from meteorseed_scrapy.store.documents import DocumentError
from meteorseed_scrapy.store.sqlite import SQLiteStore
from meteorseed_scrapy.task.canonical import url_hash
from meteorseed_scrapy.task.context import CURRENT_OUTPUT, CURRENT_SCRAPE, Output, Scrape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.polling import wait_until
from tests.store_helpers import all_ids

PIPELINE = "meteorseed_scrapy.pipelines.UpsertPipeline"


class ProbeStore(Store):
    """A real SQLite store that records each write and can fail, block or refuse on demand."""

    def __init__(self, path: Path, fail_times: int = 0, fail_forever: bool = False) -> None:
        self.inner = SQLiteStore(str(path))
        self.fail_times = fail_times
        self.fail_forever = fail_forever
        self.gate: threading.Event | None = None
        self.writes: list[list[dict[str, Any]]] = []
        self.attempts = 0
        self.threads: set[str] = set()
        self.closed = False

    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        self.attempts += 1
        self.threads.add(threading.current_thread().name)
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail_forever or self.fail_times > 0:
            self.fail_times -= 1
            raise StoreUnavailable("store is down (test)")
        if any(doc.get("poison") for doc in docs):
            raise ValueError("document refused (test)")
        self.inner.upsert_many(docs)
        self.writes.append(docs)

    def get(self, doc_id: str) -> dict[str, Any] | None:
        return self.inner.get(doc_id)

    def count(self) -> int:
        return self.inner.count()

    def iter_docs(self) -> Iterator[dict[str, Any]]:
        return self.inner.iter_docs()

    def close(self) -> None:
        self.closed = True
        self.inner.close()


def make_pipeline(
    store: Store, *, batch_size: int = 100, batch_wait: float = 0.05, retry_max: float = 30.0
) -> UpsertPipeline:
    crawler = get_crawler(
        settings_dict={
            "METEORSEED_STORE_BATCH_SIZE": batch_size,
            "METEORSEED_STORE_BATCH_WAIT": batch_wait,
            "METEORSEED_STORE_RETRY_MAX": retry_max,
        }
    )
    config = StoreConfig.from_settings(crawler.settings)
    return UpsertPipeline(
        config, crawler.stats, store_factory=lambda uri: store, default_site_id="spider"
    )


def stat(pipeline: UpsertPipeline, name: str) -> Any:
    assert pipeline.stats is not None
    return pipeline.stats.get_value(f"meteorseed/store/{name}")


def new_scrape(url: str = "https://news.example/a?b=2&a=1", site: str = "news") -> Scrape:
    return Scrape(ExecTask.create(seed_id="seed1", site_id=site, url=url))


async def in_scrape(scrape: Scrape | None, make: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``make()`` in its own task with ``scrape`` current, as the scheduler arranges."""

    async def runner() -> Any:
        CURRENT_SCRAPE.set(scrape)
        return await make()

    return await asyncio.create_task(runner())


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProbeStore]:
    probe = ProbeStore(tmp_path / "items.db")
    yield probe
    probe.inner.close()


def test_concurrent_items_share_few_batches_and_pass_only_once_committed(
    store: ProbeStore,
) -> None:
    pipeline = make_pipeline(store, batch_size=100)
    scrapes = [new_scrape(f"https://news.example/{i}") for i in range(250)]

    async def main() -> list[Any]:
        pipeline.open_spider()
        items = [{"unique_key": f"k{i}", "n": i} for i in range(250)]
        results = await asyncio.gather(
            *(
                in_scrape(s, partial(pipeline.process_item, it))
                for s, it in zip(scrapes, items, strict=True)
            )
        )
        # Each item came back only after its batch was written.
        assert store.count() == 250
        await pipeline.close_spider()
        return results

    results = run(main())
    assert results[7] == {"unique_key": "k7", "n": 7}
    assert [len(batch) for batch in store.writes] == [100, 100, 50]
    assert store.threads == {"meteorseed-store_0"}  # never the event loop's thread
    assert stat(pipeline, "committed") == 250 and stat(pipeline, "batches") == 3
    assert all(s.committed == 1 and not s.errors for s in scrapes)
    doc = store.get("news:k7")
    assert doc is not None and doc["task_id"] == scrapes[7].task.task_id
    assert doc["seed_id"] == "seed1" and doc["url"] == "https://news.example/7"
    assert doc["unique_key"] == "k7" and doc["n"] == 7


def test_item_waits_for_the_commit(store: ProbeStore) -> None:
    pipeline = make_pipeline(store, batch_wait=0.01)
    store.gate = threading.Event()

    async def main() -> None:
        scrape = new_scrape()
        task = asyncio.create_task(in_scrape(scrape, lambda: pipeline.process_item({"a": 1})))
        await asyncio.sleep(0.2)
        assert not task.done() and scrape.committed == 0  # the write is still blocked
        store.gate.set()  # type: ignore[union-attr]
        await asyncio.wait_for(task, 5)
        assert scrape.committed == 1
        await pipeline.close_spider()

    run(main())


def test_keyless_item_is_keyed_by_the_task_url_fingerprint(store: ProbeStore) -> None:
    pipeline = make_pipeline(store)
    scrape = new_scrape("https://news.example/a?b=2&a=1#frag")

    async def main() -> None:
        await in_scrape(scrape, lambda: pipeline.process_item({"title": "t"}))
        await pipeline.close_spider()

    run(main())
    key = url_hash("https://news.example/a?a=1&b=2")  # canonical: sorted, no fragment
    assert key == hashlib.sha256(b"https://news.example/a?a=1&b=2").hexdigest()
    doc = store.get(f"news:{key}")
    assert doc is not None and doc["title"] == "t" and "unique_key" not in doc


def test_keyless_items_of_a_scrape_get_stable_distinct_keys(store: ProbeStore) -> None:
    """The n-th keyless item a callback yielded is keyed ``<url hash>-<n>`` (the first keeps
    the bare hash), by its place in the callback's output, not by the order in which the
    store stage sees it: a redelivered task upserts the same documents."""
    pipeline = make_pipeline(store)
    items = [{"n": 0}, {"unique_key": "x", "n": "keyed"}, {"n": 1}, {"n": 2}]

    async def one_scrape(order: list[int]) -> Scrape:
        scrape = new_scrape()
        outputs = [Output(scrape, item) for item in items]  # as yielded

        async def in_output(i: int) -> None:
            CURRENT_OUTPUT.set(outputs[i])
            await pipeline.process_item(dict(items[i]))

        for i in order:  # as the store stage sees them: any order
            await in_scrape(scrape, partial(in_output, i))
        return scrape

    async def main() -> None:
        first = await one_scrape([0, 1, 2, 3])
        again = await one_scrape([3, 2, 1, 0])  # the same task delivered again
        await pipeline.close_spider()
        assert first.committed == again.committed == 4 and not first.errors

    run(main())
    key = url_hash("https://news.example/a?a=1&b=2")
    assert {doc["_id"]: doc["n"] for doc in store.inner.iter_docs()} == {
        f"news:{key}": 0, "news:x": "keyed", f"news:{key}-1": 1, f"news:{key}-2": 2}


def test_keyless_items_without_their_output_known_still_get_distinct_keys(
        store: ProbeStore) -> None:
    pipeline = make_pipeline(store)
    scrape = new_scrape()

    async def main() -> None:
        for n in range(3):
            await in_scrape(scrape, partial(pipeline.process_item, {"n": n}))
        await pipeline.close_spider()

    run(main())
    assert scrape.committed == 3 and store.count() == 3


@pytest.mark.parametrize("junk", ["a string", object(), 42, ["a", "list"]])
def test_what_is_not_an_item_passes_on_unstored_without_failing_the_scrape(
        store: ProbeStore, junk: Any, caplog: pytest.LogCaptureFixture) -> None:
    pipeline = make_pipeline(store)
    scrape = new_scrape()

    async def main() -> None:
        assert await in_scrape(scrape, lambda: pipeline.process_item(junk)) is junk
        await pipeline.close_spider()

    run(main())
    assert store.count() == 0 and not scrape.errors
    assert pipeline.stats is not None
    assert pipeline.stats.get_value("meteorseed/items/not_an_item") == 1
    assert "Not an item, not stored" in caplog.text


def test_record_commit_gets_the_canonical_item_json(store: ProbeStore) -> None:
    pipeline = make_pipeline(store)
    scrape = new_scrape()
    item = {"unique_key": "k", "z": [1, 2], "a": "é"}

    async def main() -> None:
        await in_scrape(scrape, lambda: pipeline.process_item(item))
        await pipeline.close_spider()

    run(main())
    expected = hashlib.sha256(b'news:k\0{"a":"\xc3\xa9","unique_key":"k","z":[1,2]}\0')
    assert scrape.committed == 1 and scrape.digest == expected.hexdigest()


def test_store_outage_is_retried_until_it_recovers(store: ProbeStore) -> None:
    store.fail_times = 3
    pipeline = make_pipeline(store, retry_max=20)
    scrapes = [new_scrape(f"https://news.example/{i}") for i in range(10)]

    async def main() -> None:
        await asyncio.gather(
            *(in_scrape(s, lambda: pipeline.process_item({"x": 1})) for s in scrapes)
        )
        await pipeline.close_spider()

    run(main())
    assert store.count() == 10 and all(s.committed == 1 for s in scrapes)
    assert stat(pipeline, "retries") == 3 and stat(pipeline, "committed") == 10
    assert stat(pipeline, "failed") is None


def test_items_written_during_an_outage_keep_their_order(store: ProbeStore) -> None:
    store.fail_times = 4
    pipeline = make_pipeline(store, batch_wait=0, retry_max=20)

    async def main() -> None:
        first = asyncio.create_task(
            in_scrape(new_scrape(), lambda: pipeline.process_item({"unique_key": "k", "v": 1}))
        )
        await wait_until(lambda: store.fail_times < 4)  # batch 1 failed and is backing off
        await in_scrape(new_scrape(), lambda: pipeline.process_item({"unique_key": "k", "v": 2}))
        await first
        await pipeline.close_spider()

    run(main())
    doc = store.get("news:k")
    assert doc is not None and doc["v"] == 2


def test_store_down_for_good_fails_items_after_retry_max(store: ProbeStore) -> None:
    store.fail_forever = True
    pipeline = make_pipeline(store, retry_max=0.4)
    scrapes = [new_scrape(f"https://news.example/{i}") for i in range(3)]

    async def main() -> list[Any]:
        results = await asyncio.gather(
            *(in_scrape(s, lambda: pipeline.process_item({"x": 1})) for s in scrapes),
            return_exceptions=True,
        )
        await pipeline.close_spider()
        return results

    started = time.monotonic()
    results = run(main())
    elapsed = time.monotonic() - started
    assert all(isinstance(r, StoreWriteError) for r in results), results
    assert isinstance(results[0].__cause__, StoreUnavailable)
    assert 0.4 <= elapsed < 3
    assert store.attempts >= 3 and stat(pipeline, "retries") == store.attempts - 1
    assert stat(pipeline, "failed") == 3 and stat(pipeline, "committed") is None
    assert all(s.committed == 0 for s in scrapes)


def test_a_refused_document_fails_alone(store: ProbeStore) -> None:
    pipeline = make_pipeline(store)
    items = [{"unique_key": f"k{i}"} for i in range(5)] + [{"unique_key": "bad", "poison": True}]

    async def main() -> list[Any]:
        results = await asyncio.gather(
            *(in_scrape(new_scrape(), partial(pipeline.process_item, it)) for it in items),
            return_exceptions=True,
        )
        await pipeline.close_spider()
        return results

    results = run(main())
    assert isinstance(results[-1], StoreWriteError) and "news:bad" in str(results[-1])
    assert results[:5] == items[:5]
    assert store.count() == 5 and stat(pipeline, "failed") == 1


def test_close_flushes_the_open_batch(store: ProbeStore) -> None:
    pipeline = make_pipeline(store, batch_wait=60)

    async def main() -> None:
        pipeline.open_spider()
        tasks = [
            asyncio.create_task(
                in_scrape(new_scrape(), partial(pipeline.process_item, {"unique_key": i}))
            )
            for i in range(5)
        ]
        await asyncio.sleep(0.05)
        assert store.count() == 0  # still waiting for a fuller batch
        await asyncio.wait_for(pipeline.close_spider(), 5)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)

    run(main())
    assert store.closed and store.inner.count() == 5


def test_unserialisable_value_is_an_error_naming_the_field(store: ProbeStore) -> None:
    pipeline = make_pipeline(store)

    async def main() -> None:
        with pytest.raises(DocumentError, match=r"meta\.when"):
            await in_scrape(
                new_scrape(), lambda: pipeline.process_item({"meta": {"when": object()}})
            )
        await pipeline.close_spider()

    run(main())
    assert store.attempts == 0


class Article(scrapy.Item):
    unique_key = scrapy.Field()
    title = scrapy.Field()


@dataclass
class Product:
    url: str
    price: float


def test_items_without_a_scrape_use_their_own_fields(store: ProbeStore) -> None:
    pipeline = make_pipeline(store)

    async def main() -> None:
        await pipeline.process_item(Article(unique_key="a1", title="T"))
        await pipeline.process_item({"site_id": "shop", "url": "https://s.example/p", "n": 1})
        await pipeline.process_item(Product(url="https://s.example/q", price=9.5))
        await pipeline.process_item({"title": "no key, no url"})  # keyed by its content
        await pipeline.close_spider()

    run(main())
    article = store.get("spider:a1")
    assert article is not None and article["title"] == "T" and article["url"] is None
    shop = store.get(f"shop:{url_hash('https://s.example/p')}")
    assert shop is not None and shop["n"] == 1 and shop["task_id"] is None
    product = store.get(f"spider:{url_hash('https://s.example/q')}")
    assert product is not None and product["price"] == 9.5
    content = hashlib.sha256(b'{"title":"no key, no url"}').hexdigest()
    assert store.get(f"spider:content-{content}") is not None


def test_from_crawler_reads_settings_and_does_no_io(tmp_path: Path) -> None:
    path = tmp_path / "lazy.db"
    crawler = get_crawler(
        settings_dict={
            "METEORSEED_STORE_URI": f"sqlite:///{path}",
            "METEORSEED_STORE_BATCH_SIZE": 7,
        }
    )
    pipeline = UpsertPipeline.from_crawler(crawler)
    assert pipeline.config.batch_size == 7 and pipeline.config.retry_max == 30.0
    assert not path.exists()

    async def main() -> None:
        pipeline.open_spider()
        await in_scrape(new_scrape(), lambda: pipeline.process_item({"unique_key": "k"}))
        await pipeline.close_spider()

    run(main())
    with SQLiteStore(str(path)) as check:
        assert all_ids(check) == {"news:k"}


class NamedInInit(scrapy.Spider):
    """No class-level ``name``: set by ``__init__`` (issue 27 point 6)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("named_late", *args, **kwargs)


def test_a_spider_named_in_init_gives_its_name_to_items_outside_a_task(tmp_path: Path) -> None:
    path = tmp_path / "late.db"
    crawler = get_crawler(NamedInInit, {"METEORSEED_STORE_URI": f"sqlite:///{path}"})
    pipeline = UpsertPipeline.from_crawler(crawler)  # before: AttributeError: name
    crawler.spider = NamedInInit.from_crawler(crawler)

    async def main() -> None:
        pipeline.open_spider()
        await pipeline.process_item({"unique_key": "k"})
        await pipeline.close_spider()

    run(main())
    with SQLiteStore(str(path)) as check:
        assert all_ids(check) == {"named_late:k"}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"METEORSEED_STORE_URI": "redis://localhost"}, "METEORSEED_STORE_URI"),
        ({"METEORSEED_STORE_BATCH_SIZE": "lots"}, "METEORSEED_STORE_BATCH_SIZE"),
    ],
)
def test_bad_settings_stop_the_crawl_instead_of_disabling_the_stage(
    settings: dict[str, Any], message: str
) -> None:
    # NotConfigured would make Scrapy skip the stage, so items would pass without being stored.
    with pytest.raises(ValueError, match=message):
        UpsertPipeline.from_crawler(get_crawler(settings_dict=settings))


def test_scrapy_item_pipeline_manager_runs_it_without_deprecations(tmp_path: Path) -> None:
    crawler = get_crawler(
        settings_dict={
            "ITEM_PIPELINES": {PIPELINE: 900},
            "METEORSEED_STORE_URI": f"sqlite:///{tmp_path}/m.db",
        }
    )

    async def main() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ScrapyDeprecationWarning)
            manager = ItemPipelineManager.from_crawler(crawler)
            await manager.open_spider_async()
            out = await in_scrape(new_scrape(), lambda: manager.process_item_async({"a": 1}))
            await manager.close_spider_async()
        return out

    assert run(main()) == {"a": 1}
    with SQLiteStore(f"{tmp_path}/m.db") as check:
        assert check.count() == 1

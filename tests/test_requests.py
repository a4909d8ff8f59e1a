"""ExecTask <-> scrapy.Request conversion (no pickle: callbacks by name, JSON-safe meta)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import scrapy
from scrapy import Request

from meteorseed_scrapy.middlewares import SiteSlotMiddleware
from meteorseed_scrapy.task.context import TASK_META_KEY, task_of
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.worker.requests import START_SEED_ID, request_to_task, task_to_request


class ShopSpider(scrapy.Spider):
    name = "shop"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None

    def parse_item(self, response: Any, **kwargs: Any) -> Any:
        return None

    def on_error(self, failure: Any) -> Any:
        return None

    not_callable = "parse_item"


def module_level_callback(response: Any) -> None:
    return None


@pytest.fixture
def spider() -> ShopSpider:
    return ShopSpider()


@pytest.fixture
def parent() -> ExecTask:
    return ExecTask.create(
        seed_id="seed-7", site_id="example_news", url="https://example.com/list",
        meta={"section": "world"},
    )


def make_task(**kwargs: Any) -> ExecTask:
    return ExecTask.create(seed_id="s1", site_id="news", url="https://example.com/a", **kwargs)


# -- task -> request ---------------------------------------------------------------------------


def test_task_to_request_by_callback_name(spider: ShopSpider) -> None:
    task = make_task(callback="parse_item", errback="on_error")
    request = task_to_request(task, spider)
    assert request.url == task.url
    assert request.callback == spider.parse_item
    assert request.errback == spider.on_error


def test_task_without_callback_uses_default_parse(spider: ShopSpider) -> None:
    request = task_to_request(make_task(), spider)
    assert request.callback is None  # Scrapy then calls spider.parse
    assert request.errback is None


@pytest.mark.parametrize("name", ["parse_missing", "not_callable"])
def test_task_with_unknown_callback_names_callback(spider: ShopSpider, name: str) -> None:
    with pytest.raises(TaskError) as info:
        task_to_request(make_task(callback=name), spider)
    assert info.value.field == "callback"
    assert name in info.value.problem


def test_task_with_unknown_errback_names_errback(spider: ShopSpider) -> None:
    with pytest.raises(TaskError) as info:
        task_to_request(make_task(errback="nope"), spider)
    assert info.value.field == "errback"


def test_task_request_carries_task_and_fields(spider: ShopSpider) -> None:
    task = make_task(
        method="POST",
        headers={"X-Token": "abc", "Accept": ["text/html", "application/json"]},
        body='{"q":"été"}',
        meta={"page": 3},
        cb_kwargs={"category": "shoes"},
        priority=7,
    )
    request = task_to_request(task, spider)
    assert request.meta[TASK_META_KEY] is task
    assert task_of(request) is task
    assert request.meta["page"] == 3
    assert request.method == "POST"
    assert request.body == '{"q":"été"}'.encode()
    assert request.headers.get("X-Token") == b"abc"
    assert request.headers.getlist("Accept") == [b"text/html", b"application/json"]
    assert request.cb_kwargs == {"category": "shoes"}
    assert request.priority == 7
    assert request.dont_filter is True


def test_task_request_is_never_filtered(spider: ShopSpider) -> None:
    assert task_to_request(make_task(), spider).dont_filter is True


def test_request_meta_is_a_copy_of_task_meta(spider: ShopSpider) -> None:
    task = make_task(meta={"page": 1})
    request = task_to_request(task, spider)
    request.meta["page"] = 99
    request.meta["extra"] = True
    assert dict(task.meta) == {"page": 1}


# -- request -> task ---------------------------------------------------------------------------


def test_request_callback_and_errback_stored_by_name(
    spider: ShopSpider, parent: ExecTask
) -> None:
    request = Request("https://example.com/item/1", callback=spider.parse_item,
                      errback=spider.on_error)
    task = request_to_task(request, spider, parent)
    assert task.callback == "parse_item"
    assert task.errback == "on_error"
    assert task.url == "https://example.com/item/1"


def test_request_without_callback_has_no_callback_name(
    spider: ShopSpider, parent: ExecTask
) -> None:
    task = request_to_task(Request("https://example.com/x"), spider, parent)
    assert task.callback is None
    assert task.errback is None


@pytest.mark.parametrize(
    "callback",
    [
        lambda response: None,
        module_level_callback,
        ShopSpider().parse_item,  # a method of another spider instance
    ],
    ids=["lambda", "function", "other-spider"],
)
def test_non_method_callback_is_rejected(
    spider: ShopSpider, parent: ExecTask, callback: Any
) -> None:
    request = Request("https://example.com/x", callback=callback)
    with pytest.raises(TaskError) as info:
        request_to_task(request, spider, parent)
    assert info.value.field == "callback"


def test_lambda_errback_is_rejected(spider: ShopSpider, parent: ExecTask) -> None:
    request = Request("https://example.com/x", errback=lambda failure: None)
    with pytest.raises(TaskError) as info:
        request_to_task(request, spider, parent)
    assert info.value.field == "errback"


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        ({"ok": 1, "when": datetime.timedelta(days=1)}, "meta.when"),
        ({"obj": object()}, "meta.obj"),
        ({"nan": float("nan")}, "meta.nan"),
        ({"deep": {"set": frozenset({1, 2})}}, "meta.deep"),
    ],
)
def test_non_json_meta_names_the_key(
    spider: ShopSpider, parent: ExecTask, meta: dict[str, Any], field: str
) -> None:
    request = Request("https://example.com/x", meta=meta)
    with pytest.raises(TaskError) as info:
        request_to_task(request, spider, parent)
    assert info.value.field == field


def test_non_json_cb_kwargs_names_the_key(spider: ShopSpider, parent: ExecTask) -> None:
    request = Request("https://example.com/x", callback=spider.parse_item,
                      cb_kwargs={"fine": "yes", "when": datetime.timedelta(days=1)})
    with pytest.raises(TaskError) as info:
        request_to_task(request, spider, parent)
    assert info.value.field == "cb_kwargs.when"


def test_json_safety_has_one_wording_for_tasks_and_yielded_requests(
    spider: ShopSpider, parent: ExecTask
) -> None:
    when = datetime.timedelta(days=1)
    with pytest.raises(TaskError) as from_request:
        request_to_task(Request("https://example.com/x", meta={"when": when}), spider, parent)
    with pytest.raises(TaskError) as from_task:
        ExecTask.create(seed_id="s1", site_id="shop", url="https://example.com/x",
                        meta={"when": when})
    assert from_request.value.field == from_task.value.field == "meta.when"
    assert str(from_request.value) == str(from_task.value)
    assert str(from_task.value).startswith("meta.when: is not JSON-serialisable (")
    assert str(from_task.value).endswith("): datetime.timedelta(days=1)")


def test_meta_with_non_string_key_is_rejected(spider: ShopSpider, parent: ExecTask) -> None:
    meta: dict[Any, Any] = {("a", "b"): 1}
    request = Request("https://example.com/x", meta=meta)
    with pytest.raises(TaskError) as info:
        request_to_task(request, spider, parent)
    assert info.value.field.startswith("meta")


def test_binary_body_travels_as_base64(spider: ShopSpider, parent: ExecTask) -> None:
    request = Request("https://example.com/upload", method="POST", body=b"\xff\xfe\x00binary")
    task = ExecTask.from_message(request_to_task(request, spider, parent).to_message())
    assert (task.body, task.body_b64) == ("", "//4AYmluYXJ5")
    assert task_to_request(task, spider).body == b"\xff\xfe\x00binary"


def test_utf8_body_is_kept(spider: ShopSpider, parent: ExecTask) -> None:
    request = Request("https://example.com/search", method="POST",
                      body='{"q": "naïve"}'.encode())
    task = request_to_task(request, spider, parent)
    assert task.method == "POST"
    assert task.body == '{"q": "naïve"}'


def test_per_download_meta_keys_are_stripped_the_slot_kept(spider: ShopSpider,
                                                           parent: ExecTask) -> None:
    request = Request(
        "https://example.com/x",
        meta={
            "retry_times": 2,
            "download_slot": "example.com",
            "download_latency": 0.25,
            "redirect_times": 1,
            "redirect_urls": ["https://example.com/old"],
            TASK_META_KEY: parent,  # not JSON-safe: must be dropped before the check
            "keep_me": {"page": 2},
            "dont_redirect": True,
        },
    )
    task = request_to_task(request, spider, parent)
    assert dict(task.meta) == {"keep_me": {"page": 2}, "dont_redirect": True,
                               "download_slot": "example.com"}


@pytest.mark.parametrize(("meta", "slot"), [({"download_slot": "books"}, "books"),
                                            ({"download_slot": None}, None),
                                            ({}, "site:example_news")])
def test_a_spider_s_own_slot_is_the_one_its_task_is_downloaded_in(
        spider: ShopSpider, parent: ExecTask, meta: dict[str, Any], slot: str | None) -> None:
    task = request_to_task(Request("https://example.com/x", meta=meta), spider, parent)
    request = task_to_request(ExecTask.from_message(task.to_message()), spider)
    SiteSlotMiddleware().process_request(request, spider)
    assert request.meta["download_slot"] == slot


def test_child_inherits_parent_seed_and_site(spider: ShopSpider, parent: ExecTask) -> None:
    task = request_to_task(Request("https://other.example.org/p"), spider, parent)
    assert task.seed_id == "seed-7"
    assert task.site_id == "example_news"
    assert task.task_id != parent.task_id
    assert task.retry_count == 0
    assert "section" not in task.meta  # a child starts from its own request's meta


def test_start_request_site_from_meta(spider: ShopSpider) -> None:
    task = request_to_task(Request("https://example.com/", meta={"site_id": "shop_eu"}),
                           spider, None)
    assert task.seed_id == START_SEED_ID == "start"
    assert task.site_id == "shop_eu"
    assert task.meta["site_id"] == "shop_eu"


def test_start_request_site_defaults_to_spider_name(spider: ShopSpider) -> None:
    task = request_to_task(Request("https://example.com/"), spider, None)
    assert task.seed_id == "start"
    assert task.site_id == "shop"


def test_headers_round_trip(spider: ShopSpider, parent: ExecTask) -> None:
    request = Request(
        "https://example.com/x",
        headers={"X-Token": "abc", "Accept-Language": ["fr", "en;q=0.5"]},
    )
    task = request_to_task(request, spider, parent)
    assert task.headers == {"X-Token": ["abc"], "Accept-Language": ["fr", "en;q=0.5"]}
    again = task_to_request(ExecTask.from_message(task.to_message()), spider)
    assert again.headers.getlist("X-Token") == [b"abc"]
    assert again.headers.getlist("Accept-Language") == [b"fr", b"en;q=0.5"]


def test_priority_kept_both_ways(spider: ShopSpider, parent: ExecTask) -> None:
    task = request_to_task(Request("https://example.com/x", priority=-4), spider, parent)
    assert task.priority == -4
    assert task_to_request(task, spider).priority == -4


def test_full_round_trip_through_the_stream_format(spider: ShopSpider, parent: ExecTask) -> None:
    request = Request(
        "https://example.com/search?q=1",
        method="PUT",
        body=b"a=1&b=2",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        callback=spider.parse_item,
        errback=spider.on_error,
        meta={"page": 2, "filters": ["new"]},
        cb_kwargs={"category": "shoes"},
        priority=5,
        dont_filter=False,
    )
    task = ExecTask.from_message(request_to_task(request, spider, parent).to_message())
    again = task_to_request(task, spider)
    assert again.url == request.url
    assert again.method == "PUT"
    assert again.body == b"a=1&b=2"
    assert again.headers.get("Content-Type") == b"application/x-www-form-urlencoded"
    assert again.callback == spider.parse_item
    assert again.errback == spider.on_error
    assert again.cb_kwargs == {"category": "shoes"}
    assert again.priority == 5
    assert again.dont_filter is False
    assert {k: v for k, v in again.meta.items() if k != TASK_META_KEY} == {
        "page": 2, "filters": ["new"],
    }
    assert again.meta[TASK_META_KEY] is task

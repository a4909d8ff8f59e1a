"""Every field of a yielded Request survives request -> task -> stream message -> request, and
a hostile stream message is refused with the field named (issue 26 points 3-4, 27 point 6)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import scrapy
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.http import FormRequest, JsonRequest, XmlRpcRequest
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule
from scrapy_playwright.page import PageMethod

from meteorseed_scrapy.task.context import TASK_META_KEY
from meteorseed_scrapy.task.exec_task import MAX_MESSAGE_BYTES, MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.worker.requests import request_to_task, task_to_request


class TaggedRequest(Request):
    """A user subclass with an attribute of its own (listed in ``attributes``)."""

    attributes: tuple[str, ...] = (*Request.attributes, "tag")

    def __init__(self, *args: Any, tag: str = "", **kwargs: Any) -> None:
        self.tag = tag
        super().__init__(*args, **kwargs)


class NeedyRequest(Request):
    """Cannot be rebuilt from its attributes: ``token`` is required and not in attributes."""

    def __init__(self, url: str, token: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)


class ShopSpider(scrapy.Spider):
    name = "shop"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None

    def parse_item(self, response: Any, **kwargs: Any) -> Any:
        return None

    async def parse_async(self, response: Any, **kwargs: Any) -> Any:
        yield {}

    def on_error(self, failure: Any) -> Any:
        return None


class RulesSpider(CrawlSpider):
    name = "rules"
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True),)

    def parse_item(self, response: Any) -> Any:
        return None


SPIDER = ShopSpider()
PARENT = ExecTask.create(seed_id="s", site_id="shop", url="https://shop.example/list")


def trip(request: Request, spider: scrapy.Spider = SPIDER) -> Request:
    """request -> task -> stream message -> task -> request."""
    task = request_to_task(request, spider, PARENT)
    return task_to_request(ExecTask.from_message(task.to_message()), spider)


def fields(request: Request, spider: scrapy.Spider = SPIDER) -> dict[str, Any]:
    out = request.to_dict(spider=spider)
    out["meta"] = {k: v for k, v in out["meta"].items() if k != TASK_META_KEY}
    out["class"] = type(request)
    return out


# -- the property --------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8)
HEADER_NAME = st.from_regex(r"\AX-[A-Za-z0-9]{1,8}\Z")
HEADER_VALUE = st.binary(max_size=12).filter(
    lambda b: b"\r" not in b and b"\n" not in b and b == b.strip())
COOKIE_TEXT = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e,
                                    exclude_characters=";=,\\\""), min_size=1, max_size=8)
COOKIES = st.one_of(
    st.dictionaries(COOKIE_TEXT, COOKIE_TEXT, max_size=3),
    st.lists(st.fixed_dictionaries(
        {"name": COOKIE_TEXT, "value": COOKIE_TEXT},
        optional={"path": st.just("/"), "domain": st.just("shop.example"),
                  "secure": st.booleans()}), min_size=1, max_size=3))
CLASSES = st.sampled_from([
    (Request, {}), (FormRequest, {}), (JsonRequest, {"dumps_kwargs": {"sort_keys": False}}),
    (XmlRpcRequest, {}), (TaggedRequest, {"tag": "t1"})])
METHODS = st.sampled_from([None, SPIDER.parse, SPIDER.parse_item, SPIDER.parse_async,
                           SPIDER.on_error])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.text(st.characters(min_codepoint=0x61, max_codepoint=0x7a), max_size=10),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    headers=st.dictionaries(HEADER_NAME, st.lists(HEADER_VALUE, min_size=1, max_size=2),
                            max_size=3),
    body=st.binary(max_size=64) | st.text(max_size=32).map(str.encode),
    cookies=COOKIES,
    meta=st.dictionaries(st.text(max_size=6).map(lambda k: "k" + k), JSON, max_size=4),
    cb_kwargs=st.dictionaries(st.from_regex(r"\A[a-z]{1,6}\Z"), JSON, max_size=3),
    callback=METHODS, errback=METHODS,
    priority=st.integers(-(2**31), 2**31),
    dont_filter=st.booleans(),
    encoding=st.sampled_from(["utf-8", "latin-1", "cp1252", "ascii"]),
    flags=st.lists(st.text(max_size=6), max_size=3),
    cls=CLASSES,
)
def test_every_field_comes_back_equal(path: str, method: str, headers: dict[str, Any],
                                      body: bytes, cookies: Any, meta: dict[str, Any],
                                      cb_kwargs: dict[str, Any], callback: Any, errback: Any,
                                      priority: int, dont_filter: bool, encoding: str,
                                      flags: list[str], cls: Any) -> None:
    request_cls, extra = cls
    request = request_cls(
        f"https://shop.example/{path}", method=method, headers=headers, body=body,
        cookies=cookies, meta=meta, cb_kwargs=cb_kwargs, callback=callback, errback=errback,
        priority=priority, dont_filter=dont_filter, encoding=encoding, flags=flags, **extra)
    again = trip(request)
    assert fields(again) == fields(request)
    assert again.body == request.body and type(again) is type(request)


def test_the_stream_keeps_them_too(sync_redis: redis.Redis, namespace: str) -> None:
    request = JsonRequest("https://shop.example/api", data={"q": "naïve"},
                          cookies=[{"name": "sid", "value": "42", "path": "/"}],
                          flags=["api"], encoding="latin-1", callback=SPIDER.parse_item,
                          errback=SPIDER.on_error, dont_filter=True, priority=3,
                          meta={"page": 2}, cb_kwargs={"n": 1})
    task = request_to_task(request, SPIDER, PARENT)
    stream = f"{namespace}:roundtrip"
    sync_redis.xadd(stream, task.to_message())  # type: ignore[arg-type]
    [(_, message)] = sync_redis.xrange(stream)
    again = task_to_request(ExecTask.from_message(message), SPIDER)
    assert fields(again) == fields(request)


# -- one field at a time --------------------------------------------------------------------

def test_crawlspider_rule_callbacks_travel_by_name() -> None:
    spider = RulesSpider()
    request = spider._build_request(0, scrapy.link.Link("https://shop.example/p/1", "One"))
    task = request_to_task(request, spider, PARENT)
    assert (task.callback, task.errback, task.meta["rule"]) == ("_callback", "_errback", 0)
    again = trip(request, spider)
    assert again.callback == spider._callback and again.errback == spider._errback


def test_a_request_without_callback_in_a_crawlspider_keeps_none() -> None:
    spider = RulesSpider()
    assert trip(Request("https://shop.example/", callback=spider._parse), spider).callback \
        is None


def test_page_methods_are_rebuilt() -> None:
    request = Request("https://shop.example/js", meta={"playwright": True,
                      "playwright_page_methods": [
                          PageMethod("wait_for_selector", "div.item", timeout=500),
                          PageMethod("evaluate", "window.scrollBy(0, 100)")]})
    task = request_to_task(request, SPIDER, PARENT)
    assert task.meta["playwright_page_methods"][0] == {
        "$meteorseed": "PageMethod", "method": "wait_for_selector", "args": ["div.item"],
        "kwargs": {"timeout": 500}}
    methods = trip(request).meta["playwright_page_methods"]
    assert [type(m) for m in methods] == [PageMethod, PageMethod]
    assert [(m.method, m.args, m.kwargs) for m in methods] == [
        ("wait_for_selector", ("div.item",), {"timeout": 500}),
        ("evaluate", ("window.scrollBy(0, 100)",), {})]


def test_a_callable_page_method_is_refused_naming_the_key() -> None:
    request = Request("https://shop.example/js",
                      meta={"playwright_page_methods": [PageMethod(print)]})
    with pytest.raises(TaskError) as info:
        request_to_task(request, SPIDER, PARENT)
    assert info.value.field == "meta.playwright_page_methods[0]"


@pytest.mark.parametrize(("meta", "field"), [
    ({"when": object()}, "meta.when"),
    ({"deep": {"x": frozenset({1, 2})}}, "meta.deep"),
    ({"raw": b"bytes"}, "meta.raw"),
    ({"x": {"$meteorseed": "PageMethod"}}, "meta.x.$meteorseed"),
])
def test_other_non_json_meta_is_refused_naming_the_key(meta: dict[str, Any], field: str) -> None:
    with pytest.raises(TaskError) as info:
        request_to_task(Request("https://shop.example/", meta=meta), SPIDER, PARENT)
    assert info.value.field == field


def test_a_class_that_cannot_be_found_by_its_path_is_refused() -> None:
    class LocalRequest(Request):
        pass

    with pytest.raises(TaskError) as info:
        request_to_task(LocalRequest("https://shop.example/"), SPIDER, PARENT)
    assert info.value.field == "request_class"


def test_a_class_that_cannot_be_rebuilt_is_refused() -> None:
    with pytest.raises(TaskError) as info:
        request_to_task(NeedyRequest("https://shop.example/", token="x"), SPIDER, PARENT)
    assert info.value.field == "request_class"


def test_non_json_subclass_attributes_are_refused_naming_them() -> None:
    with pytest.raises(TaskError) as info:
        request_to_task(TaggedRequest("https://shop.example/", tag=object()),  # type: ignore
                        SPIDER, PARENT)
    assert info.value.field == "request_attrs.tag"


def test_a_message_written_before_these_fields_still_decodes() -> None:
    old = {"v": "1", "t": json.dumps({
        "task_id": "t1", "seed_id": "s", "site_id": "shop", "url": "https://shop.example/a",
        "method": "POST", "body": "a=1", "headers": {"Content-Type": ["text/plain"]},
        "callback": "parse_item", "meta": {"page": 1}, "priority": 2, "created_at": 1.5})}
    request = task_to_request(ExecTask.from_message(old), SPIDER)
    assert (type(request), request.method, request.body, request.cookies, request.flags,
            request.encoding, request.dont_filter) == (Request, "POST", b"a=1", {}, [],
                                                       "utf-8", True)


# -- hostile stream messages -----------------------------------------------------------------

def message(**fields: Any) -> dict[str, str]:
    task = {"task_id": "t1", "seed_id": "s", "site_id": "shop", "url": "https://shop.example/a",
            **fields}
    return {"v": MESSAGE_VERSION, "t": json.dumps(task)}


@pytest.mark.parametrize(("fields", "field"), [
    ({"body_b64": 5}, "body_b64"),
    ({"body_b64": "not base64!"}, "body_b64"),
    ({"body_b64": "AA==", "body": "x"}, "body_b64"),
    ({"cookies": "sid=1"}, "cookies"),
    ({"cookies": {"sid": {"x": 1}}}, "cookies.sid"),
    ({"cookies": {"sid": True}}, "cookies.sid"),
    ({"cookies": [{"name": "a"}]}, "cookies[0].value"),
    ({"cookies": [{"name": "a", "value": "b", "expires": 1}]}, "cookies[0].expires"),
    ({"cookies": [{"name": "a", "value": "b", "secure": "yes"}]}, "cookies[0].secure"),
    ({"cookies": ["a=b"]}, "cookies[0]"),
    ({"encoding": "no-such-codec"}, "encoding"),
    ({"encoding": 8}, "encoding"),
    ({"flags": "cached"}, "flags"),
    ({"flags": [1]}, "flags"),
    ({"flags": ["f"] * 101}, "flags"),
    ({"dont_filter": "yes"}, "dont_filter"),
    ({"request_class": "os.system; rm"}, "request_class"),
    ({"request_class": 3}, "request_class"),
    ({"request_class": "a." + "b" * 400}, "request_class"),
    ({"request_attrs": {"tag": 1}}, "request_attrs"),
    ({"request_class": "x.Y", "request_attrs": {"url": "https://evil.example/"}},
     "request_attrs.url"),
    ({"request_class": "x.Y", "request_attrs": {"_secret": 1}}, "request_attrs._secret"),
    ({"request_class": "x.Y", "request_attrs": []}, "request_attrs"),
    ({"callback": "__init__"}, "callback"),
    ({"flags": ["x" * (MAX_MESSAGE_BYTES + 1)]}, "task"),
])
def test_a_hostile_message_is_refused_naming_the_field(fields: dict[str, Any], field: str
                                                       ) -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.from_message(message(**fields))
    assert info.value.field == field


@pytest.mark.parametrize(("fields", "field"), [
    ({"request_class": "no_such_module_here.Request"}, "request_class"),
    ({"request_class": "os.system"}, "request_class"),
    ({"request_class": "scrapy.Spider"}, "request_class"),
    ({"request_class": "json.JSONDecoder"}, "request_class"),
    ({"request_class": "scrapy.http.FormRequest", "request_attrs": {"nope": 1}},
     "request_class"),
    ({"meta": {"m": {"$meteorseed": "Pickle", "data": "x"}}}, "meta.m.$meteorseed"),
    ({"meta": {"m": {"$meteorseed": "PageMethod", "method": "_impl_obj"}}}, "meta.m.method"),
    ({"meta": {"m": {"$meteorseed": "PageMethod", "method": "click", "args": {}}}},
     "meta.m.args"),
    ({"meta": {"m": {"$meteorseed": "PageMethod", "method": "click", "kwargs": [1]}}},
     "meta.m.kwargs"),
    ({"meta": {"m": {"$meteorseed": "PageMethod", "method": "click",
                     "kwargs": {"method": "x"}}}}, "meta.m.kwargs.method"),
    ({"meta": {"m": [{"$meteorseed": "PageMethod", "method": "click", "extra": 1}]}},
     "meta.m[0].extra"),
    ({"callback": "_no_such_method"}, "callback"),
])
def test_the_worker_refuses_what_it_cannot_rebuild_naming_the_field(
        fields: dict[str, Any], field: str) -> None:
    task = ExecTask.from_message(message(**fields))
    with pytest.raises(TaskError) as info:
        task_to_request(task, SPIDER)
    assert info.value.field == field


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["body_b64", "cookies", "encoding", "flags", "dont_filter",
                     "request_class", "request_attrs"]),
    JSON, min_size=1, max_size=3))
def test_any_value_of_the_new_fields_is_a_request_or_refused_naming_a_field(
        fields: dict[str, Any]) -> None:
    try:
        task = ExecTask.from_message(message(**fields))
        task_to_request(task, SPIDER)
    except TaskError as exc:
        assert exc.field.split(".")[0].split("[")[0] in {*fields, "task", "body_b64"}


# -- schemes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["data:,hello", "data:text/html;base64,PGI+aGk8L2I+",
                                 "https://shop.example/a", "HTTP://shop.example/"])
def test_tasks_take_web_and_data_urls(url: str) -> None:
    request = trip(Request(url))
    assert request.url == Request(url).url


@pytest.mark.parametrize("url", ["file:///etc/passwd", "s3://bucket/key", "gs://b/k",
                                 "ftp://files.example/a", "javascript:alert(1)", "data:no-comma",
                                 "mailto:a@b.example", "about:blank"])
def test_other_schemes_are_refused_naming_the_url(url: str) -> None:
    if ":/" in url or url.startswith("about:"):  # (Scrapy's Request refuses the others itself)
        with pytest.raises(TaskError) as info:
            request_to_task(Request(url), SPIDER, PARENT)
        assert info.value.field == "url"
    with pytest.raises(TaskError) as info:
        ExecTask.from_message(message(url=url))
    assert info.value.field == "url"


def test_a_post_body_of_some_hundred_kilobytes_travels_and_a_larger_one_is_refused() -> None:
    text, binary = b"q=" + b"x" * 250_000, bytes(range(256)) * 740  # 189 440 bytes
    for body in (text, binary):
        assert trip(Request("https://shop.example/upload", method="POST", body=body)).body \
            == body
    with pytest.raises(TaskError) as info:
        request_to_task(Request("https://shop.example/upload", method="POST",
                                body=b"x" * MAX_MESSAGE_BYTES), SPIDER, PARENT).to_message()
    assert info.value.field == "task"


TAGGED = st.fixed_dictionaries(
    {"$meteorseed": st.sampled_from(["PageMethod", "Pickle", ""]) | JSON},
    optional={"method": st.sampled_from(["click", "_impl_obj", "", "evaluate"]) | JSON,
              "args": JSON, "kwargs": JSON, "other": JSON}) | st.fixed_dictionaries(
    {"$meteorseed": st.just("PageMethod"), "method": st.sampled_from(["click", "evaluate"]),
     "args": st.lists(JSON, max_size=2),
     "kwargs": st.dictionaries(st.from_regex(r"\A[a-z]{1,5}\Z"), JSON, max_size=2)})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.from_regex(r"\A[a-z]{1,6}\Z"),
                       st.recursive(TAGGED | JSON, lambda inner: st.lists(inner, max_size=3)
                                    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                                    max_leaves=6), max_size=3))
def test_any_tagged_meta_is_rebuilt_or_refused_naming_its_path(meta: dict[str, Any]) -> None:
    try:
        task = ExecTask.from_message(message(meta=meta))
    except TaskError as exc:
        assert exc.field.startswith(("meta.", "task"))
        return
    try:
        request = task_to_request(task, SPIDER)
    except TaskError as exc:
        assert exc.field.startswith("meta.")
        return
    event("rebuilt" if any(type(v).__name__ == "PageMethod" or "PageMethod" in repr(v)
                           for v in request.meta.values()) else "plain")
    # What came back goes out again as a task meta that is a fixed point of the round trip
    # (absent args/kwargs come back empty).
    again = request_to_task(request, SPIDER, PARENT)
    assert request_to_task(task_to_request(again, SPIDER), SPIDER, PARENT).meta == again.meta

"""A spider's items and the Python values it passes on in ``meta`` and ``cb_kwargs`` reach the
next callback as they were given, though the request goes through the stream as JSON: the
project's items (a ``scrapy.Item``, a dataclass), a ``Decimal``, dates and times, sets
(meteorseed_scrapy.task.tagged). A stream message that names anything else is refused with its
path, never built."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pytest
import scrapy
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request

from meteorseed_scrapy.task.exec_task import MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.worker.requests import request_to_task, task_to_request


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    seen = scrapy.Field()
    seller = scrapy.Field()


@dataclass
class Seller:
    name: str
    rating: Decimal
    tags: set[str] = field(default_factory=set)


class ShopSpider(scrapy.Spider):
    name = "shop"

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None

    def parse_detail(self, response: Any, item: Any = None, **kwargs: Any) -> Any:
        return None


SPIDER = ShopSpider()
PARENT = ExecTask.create(seed_id="s", site_id="shop", url="https://shop.example/list")
ELSEWHERE = types.ModuleType("elsewhere_items")  # another package than the spider's


class Foreign(scrapy.Item):
    name = scrapy.Field()


Foreign.__module__ = ELSEWHERE.__name__
ELSEWHERE.Foreign = Foreign  # type: ignore[attr-defined]
sys.modules[ELSEWHERE.__name__] = ELSEWHERE


def trip(request: Request) -> Request:
    """request -> task -> stream message -> task -> request, as a worker reads it."""
    task = request_to_task(request, SPIDER, PARENT)
    return task_to_request(ExecTask.from_message(task.to_message()), SPIDER)


def message(**fields: Any) -> dict[str, str]:
    task = ExecTask.create(seed_id="s", site_id="shop", url="https://shop.example/p",
                           callback="parse_detail")
    return {"v": MESSAGE_VERSION, "t": ExecTask(**{**task.__dict__, **fields}).to_message()["t"]}


def test_a_half_filled_item_reaches_the_next_callback_as_it_was() -> None:
    seen = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
    item = Product(name="lamp", price=Decimal("19.90"), seen=seen,
                   seller=Seller("shop", Decimal("4.80"), {"fast", "cheap"}))
    back = trip(Request("https://shop.example/p/1", callback=SPIDER.parse_detail,
                        cb_kwargs={"item": item}, meta={"item": item, "n": 2}))
    for got in (back.cb_kwargs["item"], back.meta["item"]):
        assert type(got) is Product and got == item
        assert type(got["seller"]) is Seller and got["seller"].tags == {"fast", "cheap"}
        assert got["seen"].utcoffset() == timedelta(hours=2)
    assert back.meta["n"] == 2


@pytest.mark.parametrize("value", [
    Decimal("1.50"), Decimal("-0"), Decimal("NaN"), Decimal("sNaN"), Decimal("1E+999"),
    datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc),
    date(2024, 2, 29), time(0, 0), time(12, 30, 1, 5, tzinfo=timezone.utc),
    {"a", 1, None, Decimal("2.5"), date(2024, 1, 1)}, set(),
    [Decimal("1"), {"k": {2}}],
])
def test_values_come_back_of_their_own_type(value: Any) -> None:
    back = trip(Request("https://shop.example/p", meta={"v": value})).meta["v"]
    assert repr(back) == repr(value) or (isinstance(value, set) and back == value)


def test_a_named_zone_keeps_its_instant_and_offset() -> None:
    # JSON has no zone names: the ISO 8601 text carries the offset, as Scrapy's feeds write it
    try:
        paris = ZoneInfo("Europe/Paris")
    except ZoneInfoNotFoundError:
        pytest.skip("no time zone database here (Debian's tzdata)")
    seen = datetime(2026, 7, 1, 12, 30, tzinfo=paris)
    back = trip(Request("https://shop.example/p", meta={"seen": seen})).meta["seen"]
    assert back == seen and back.utcoffset() == seen.utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize(("meta", "path", "problem"), [
    ({"x": Foreign(name="n")}, "meta.x", "the project's own"),
    ({"x": [{"y": frozenset({1})}]}, "meta.x", "JSON-serialisable"),
    ({"x": {(1, 2)}}, "meta.x", "a set of other than text, numbers and dates"),
    ({"x": timedelta(1)}, "meta.x", "JSON-serialisable"),
    ({"x": {"$meteorseed": "Decimal", "value": "1"}}, "meta.x.$meteorseed", "reserved key"),
])
def test_what_cannot_travel_is_refused_at_yield_naming_its_path(
        meta: dict[str, Any], path: str, problem: str) -> None:
    with pytest.raises(TaskError) as info:
        request_to_task(Request("https://shop.example/p", meta=meta), SPIDER, PARENT)
    assert info.value.field == path and problem in info.value.problem


def test_an_item_of_a_local_class_is_refused_at_yield() -> None:
    class Local(scrapy.Item):
        name = scrapy.Field()

    with pytest.raises(TaskError) as info:
        request_to_task(Request("https://shop.example/p", cb_kwargs={"item": Local(name="n")},
                                callback=SPIDER.parse_detail), SPIDER, PARENT)
    assert info.value.field == "cb_kwargs.item"
    assert "define it at the top level of its module" in info.value.problem


ITEM_TAG = "$meteorseed"
HERE = __name__  # (how pytest imported this module: its top-level package is the spider's)


@pytest.mark.parametrize(("value", "path", "problem"), [
    # classes a message may not name: another package's, a module never imported, no item
    ({ITEM_TAG: "Item", "class": "elsewhere_items.Foreign", "fields": {}},
     "meta.x.class", "the project's own"),
    ({ITEM_TAG: "Item", "class": f"{HERE.split('.')[0]}.never_imported.Thing", "fields": {}},
     "meta.x.class", "not imported"),
    ({ITEM_TAG: "Item", "class": f"{HERE}.ShopSpider", "fields": {}},
     "meta.x.class", "is not an item class"),
    ({ITEM_TAG: "Item", "class": f"{HERE}.sys", "fields": {}},
     "meta.x.class", "is not an item class"),
    ({ITEM_TAG: "Item", "class": "os.system", "fields": {}}, "meta.x.class", "project's own"),
    ({ITEM_TAG: "Item", "class": f"{HERE}.Product", "fields": {"bad": 1}},
     "meta.x", "could not be rebuilt"),
    ({ITEM_TAG: "Item", "class": f"{HERE}.Seller", "fields": {}},
     "meta.x", "could not be rebuilt"),
    ({ITEM_TAG: "Item", "class": f"{HERE}.Product"}, "meta.x.fields",
     "must be an object"),
    ({ITEM_TAG: "Item", "class": 7, "fields": {}}, "meta.x.class", "module.Class"),
    ({ITEM_TAG: "Item", "class": f"{HERE}.Product", "fields": {},
      "init": "x"}, "meta.x.init", "is not an item field"),
    ({ITEM_TAG: "Item", "class": f"{HERE}.Product", "fields": {
        "price": {ITEM_TAG: "Decimal", "value": "ten"}}}, "meta.x.price.value", "not a Decimal"),
    ({ITEM_TAG: "Decimal", "value": "ten"}, "meta.x.value", "is not a Decimal"),
    ({ITEM_TAG: "Decimal", "value": 10}, "meta.x.value", "is not a Decimal"),
    ({ITEM_TAG: "datetime", "value": "2024-13-01"}, "meta.x.value", "is not a datetime"),
    ({ITEM_TAG: "time", "value": "25:00"}, "meta.x.value", "is not a time"),
    ({ITEM_TAG: "set", "items": [[1]]}, "meta.x", "not hashable"),
    ({ITEM_TAG: "set", "items": "ab"}, "meta.x.items", "must be a list"),
    ({ITEM_TAG: ["Decimal"], "value": "1"}, "meta.x.$meteorseed", "must name a tagged type"),
    ({ITEM_TAG: "Pickle", "value": "1"}, "meta.x.$meteorseed", "unknown tagged type"),
])
def test_a_hostile_tagged_value_is_refused_naming_its_path(value: Any, path: str,
                                                            problem: str) -> None:
    task = ExecTask.from_message(message(meta={"x": value}))
    with pytest.raises(TaskError) as info:
        task_to_request(task, SPIDER)
    assert info.value.field == path and problem in info.value.problem


def test_a_message_cannot_build_an_item_for_a_worker_without_a_spider() -> None:
    value = {ITEM_TAG: "Item", "class": f"{HERE}.Product", "fields": {}}
    with pytest.raises(TaskError) as info:
        task_to_request(ExecTask.from_message(message(cb_kwargs={"item": value},
                                                      callback=None)), None)
    assert info.value.field == "cb_kwargs.item.class"


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=5),
    st.floats(allow_nan=False, allow_infinity=False), st.decimals(allow_nan=False),
    # (fixed offsets: a named zone travels as its offset, test_a_named_zone_keeps_...)
    st.datetimes(timezones=st.none() | st.builds(
        timezone, st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23)))),
    st.dates(), st.times(),
)
VALUES = st.recursive(SCALARS | st.sets(SCALARS.filter(lambda v: v == v), max_size=3),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.from_regex(r"\A[a-z]{1,4}\Z"), inner, max_size=3)
                      | st.builds(Product, name=inner, price=inner),
                      max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.from_regex(r"\A[a-z]{1,6}\Z"), VALUES, max_size=3))
def test_any_mix_of_them_comes_back_equal(meta: dict[str, Any]) -> None:
    back = trip(Request("https://shop.example/p", meta=meta, callback=SPIDER.parse_detail,
                        cb_kwargs={"item": Product(seen=meta)}))
    assert {k: v for k, v in back.meta.items() if k in meta} == meta
    assert back.cb_kwargs["item"] == Product(seen=meta)

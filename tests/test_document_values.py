"""Item values beyond JSON's own types are stored as stock Scrapy's JSON feeds write them
(``scrapy.utils.serialize.ScrapyJSONEncoder``, the oracle here): a ``Decimal`` (a price-parser
amount) as its text, a set as a list, a nested item as an object, a date, time or datetime as
ISO 8601 text on every Scrapy. Anything else is refused naming its path, as before."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
import scrapy
from hypothesis import given
from hypothesis import strategies as st
from price_parser import Price
from scrapy.utils.serialize import ScrapyJSONEncoder

from meteorseed_scrapy.store.documents import DocumentError, check_fields

#: Whether this Scrapy's encoder writes dates as ISO 8601 (2.19 does; 2.14 drops the
#: microseconds and the time zone): then it is the oracle for them too.
ISO_SCRAPY = ScrapyJSONEncoder().default(
    datetime(2000, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc)) == "2000-01-02T03:04:05.000006+00:00"


def scrapy_json(value: Any) -> Any:
    """What stock Scrapy's JSON feed export writes for ``value``, read back."""
    return json.loads(json.dumps(value, cls=ScrapyJSONEncoder))


class Offer(scrapy.Item):
    price = scrapy.Field()
    seen = scrapy.Field()


@dataclass
class Seller:
    name: str
    rating: Decimal


def test_a_price_parser_amount_is_stored_as_scrapy_writes_it() -> None:
    price = Price.fromstring("19,90 €")
    assert price.amount == Decimal("19.90")
    fields = {"price": price.amount, "currency": price.currency}
    assert check_fields(fields) == scrapy_json(fields) == {"price": "19.90", "currency": "€"}


@pytest.mark.parametrize(("value", "stored"), [
    (Decimal("1.50"), "1.50"),  # the text: trailing zeros kept, no float rounding
    (Decimal("0.1") + Decimal("0.2"), "0.3"),
    (Decimal("-0"), "-0"),
    (Decimal("1E+3"), "1E+3"),
    (Decimal("NaN"), "NaN"),  # text, so no NaN reaches a strict JSON reader
    ({"b"}, ["b"]),
    (set(), []),
    ([{"x"}, (Decimal("2"),)], [["x"], ["2"]]),
    (Offer(price=Decimal("3.5")), {"price": "3.5"}),
    (Seller("s", Decimal("4.8")), {"name": "s", "rating": "4.8"}),
])
def test_values_beyond_json_are_stored_as_scrapy_writes_them(value: Any, stored: Any) -> None:
    assert check_fields({"v": value}) == {"v": stored} == scrapy_json({"v": value})


@pytest.mark.parametrize(("value", "stored"), [
    (datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc),
     "2026-01-02T03:04:05.123456+00:00"),
    (datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
     "2026-01-02T03:04:05-05:30"),
    (datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05"),  # naive: no zone invented
    (date(1, 1, 1), "0001-01-01"),
    (time(23, 59, 59, 999999), "23:59:59.999999"),
])
def test_dates_and_times_are_iso_8601_on_every_scrapy(value: Any, stored: str) -> None:
    assert check_fields({"when": value}) == {"when": stored}
    if ISO_SCRAPY:
        assert scrapy_json({"when": value}) == {"when": stored}


@pytest.mark.parametrize(("fields", "path"), [
    ({"raw": b"\x00\xff"}, "raw"),
    ({"frozen": frozenset({1})}, "frozen"),  # as Scrapy's feeds, which refuse it too
    ({"obj": object()}, "obj"),
    ({"deep": [{"set": {Decimal("1"), object()}}]}, r"deep\[0\]\.set\[\d\]"),
    ({"offer": Offer(price=b"x")}, r"offer\.price"),
    ({"nan": float("nan")}, "nan"),
])
def test_what_neither_json_nor_scrapy_writes_is_refused_naming_its_path(
        fields: dict[str, Any], path: str) -> None:
    with pytest.raises(DocumentError, match=f"^{path}: "):
        check_fields(fields)


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=4),
    *([st.datetimes(timezones=st.none() | st.just(timezone.utc)), st.dates(), st.times()]
      if ISO_SCRAPY else []),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.text(min_size=1, max_size=6).filter(lambda k: not k.startswith("$")
                                                             and "\0" not in k),
                    inner, max_size=4),
    st.sets(st.one_of(st.integers(), st.text(max_size=4)), max_size=4),
), max_leaves=12)


@given(st.dictionaries(st.sampled_from(["a", "b", "c.d", "é"]), values, max_size=4))
def test_stored_fields_are_what_stock_scrapys_json_feed_writes(fields: dict[str, Any]) -> None:
    assert check_fields(fields) == scrapy_json(fields)

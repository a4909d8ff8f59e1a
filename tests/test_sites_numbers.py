"""Numbers, prices and dates from real page strings of several locales: right or refused.

The tables hold strings as shops and news sites print them (en, en-IN lakh grouping, de, de-CH,
fr, es, pt-BR, ru, ja). Run against the processors before this change (``float`` with the
locale's ``decimal`` for numbers and price amounts; ``date``, the only date processor), 20 of
the 48 number and price cases came out silently wrong (``.99`` as 99.0, a U+2212 minus dropped,
``1,2,3`` as 123, ``SKU-123`` as -123, full-width digits as 1...), no price had a currency, and
all 16 dates were refused.
"""

from __future__ import annotations

import math
import sys
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy.sites.extract import extract
from meteorseed_scrapy.sites.processors import PageContext, ProcessorError, make_float, make_int
from meteorseed_scrapy.sites.quality import check
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.schema import parse_site

REFUSED = "refused"
CTX = PageContext("http://shop.example/p/1")
FETCHED = datetime(2024, 3, 10, 12, 0, tzinfo=timezone.utc)

#: (locale, text, decimal, float expected or REFUSED)
NUMBERS: list[tuple[str, str, str, Any]] = [
    ("en", "1,299.00", ".", 1299.0),
    ("en", "Price: 12,345,678.50 USD", ".", 12345678.5),
    ("en", ".99", ".", 0.99),
    ("en", "US$ .99", ".", 0.99),
    ("en", "\u221212.00", ".", -12.0),  # U+2212 MINUS SIGN
    ("en", "-3.5", ".", -3.5),
    ("en", "1,2,3", ".", REFUSED),
    ("en", "1.299,00", ".", REFUSED),  # a German price on a site read as English
    ("en", "1,29", ".", REFUSED),
    ("en", "12.00 2 items", ".", 12.0),
    ("en", "SKU-123", ".", 123.0),
    ("en", "No.5", ".", 5.0),
    ("en", "1.2.3", ".", REFUSED),
    ("en-IN", "\u20b9 1,00,000", ".", 100000.0),
    ("en-IN", "12,34,567.50", ".", 1234567.5),
    ("en-IN", "1,00,00", ".", REFUSED),
    ("de", "1.299,00 \u20ac", ",", 1299.0),
    ("de", "1.234.567,89", ",", 1234567.89),
    ("de", "0,99\u00a0\u20ac", ",", 0.99),
    ("de", ",99 \u20ac", ",", 0.99),
    ("de", "\u22125,00 \u20ac", ",", -5.0),
    ("de", "1.23", ",", REFUSED),
    ("de", "1,299.00", ",", REFUSED),  # an English price on a site read as German
    ("de-CH", "CHF 1'234.50", ".", 1234.5),
    ("de-CH", "CHF 1\u2019234.50", ".", 1234.5),
    ("fr", "1\u202f299,50\u00a0\u20ac", ",", 1299.5),
    ("fr", "12 345 678,90 \u20ac", ",", 12345678.9),
    ("fr", "1 2 3", ",", 1.0),  # a space joins groups of exactly three digits only
    ("es", "1.299,99 \u20ac", ",", 1299.99),
    ("pt-BR", "R$ 1.234,56", ",", 1234.56),
    ("pt-BR", "R$ 0,5", ",", 0.5),
    ("ru", "1\u00a0234,56 \u0440\u0443\u0431.", ",", 1234.56),
    ("ja", "\uffe51,234", ".", 1234.0),
    ("ja", "\uff11\uff0c\uff12\uff13\uff14\u5186", ".", 1234.0),  # full-width 1,234 yen
    ("ja", "1,234.5.6", ".", REFUSED),
]

#: (locale, text, price options, amount or REFUSED, currency)
PRICES: list[tuple[str, str, dict[str, Any], Any, str | None]] = [
    ("en", "$1,299.99", {}, 1299.99, "$"),
    ("en", "US$ .99", {}, 0.99, "US$"),
    ("en", "\u2212$12.00", {}, -12.0, "$"),
    ("en", "1,234.567", {}, REFUSED, None),
    ("en", "Price on request", {}, REFUSED, None),
    ("en-IN", "\u20b9 1,00,000", {}, 100000.0, "\u20b9"),
    ("de", "1.299,00 \u20ac", {}, 1299.0, "\u20ac"),
    ("de", "\u20ac -5,00", {}, -5.0, "\u20ac"),
    ("fr", "1\u202f299,50\u00a0\u20ac", {}, 1299.5, "\u20ac"),
    ("es", "12,80 \u20ac", {}, 12.8, "\u20ac"),
    ("pt-BR", "R$ 1.234,56", {}, 1234.56, "R$"),
    ("ru", "2.500 \u20bd", {"decimal": ","}, 2500.0, "\u20bd"),
    ("ja", "\uff11\uff0c\uff12\uff13\uff14\u5186", {}, 1234.0, "\u5186"),
]

#: (locale, text, date_natural options, expected ISO UTC), fetched at FETCHED
DATES: list[tuple[str, str, dict[str, Any], str]] = [
    ("fr", "3 janvier 2024", {"languages": ["fr"], "tz": "Europe/Paris"}, "2024-01-02T23:00:00Z"),
    ("fr", "il y a 2 jours", {"languages": ["fr"]}, "2024-03-08T12:00:00Z"),
    ("en", "2 hours ago", {"languages": ["en"]}, "2024-03-10T10:00:00Z"),
    ("en", "yesterday", {"languages": ["en"], "tz": "Europe/Berlin"}, "2024-03-09T12:00:00Z"),
    ("en", "March 5, 2024 14:30", {"languages": ["en"], "tz": "America/New_York"},
     "2024-03-05T19:30:00Z"),
    ("en-IN", "05/03/2024", {"languages": ["en"], "date_order": "DMY"}, "2024-03-05T00:00:00Z"),
    ("de", "2. M\u00e4rz 2024", {"languages": ["de"], "tz": "Europe/Berlin"},
     "2024-03-01T23:00:00Z"),
    ("de", "vor 3 Tagen", {"languages": ["de"]}, "2024-03-07T12:00:00Z"),
    ("es", "5 de marzo de 2024", {"languages": ["es"], "tz": "Europe/Madrid"},
     "2024-03-04T23:00:00Z"),
    ("es", "hace 1 hora", {"languages": ["es"]}, "2024-03-10T11:00:00Z"),
    ("pt-BR", "5 de mar\u00e7o de 2024", {"languages": ["pt"], "tz": "America/Sao_Paulo"},
     "2024-03-05T03:00:00Z"),
    ("pt-BR", "ontem", {"languages": ["pt"]}, "2024-03-09T12:00:00Z"),
    ("ru", "5 \u043c\u0430\u0440\u0442\u0430 2024 \u0433.", {"languages": ["ru"],
                                                          "tz": "Europe/Moscow"},
     "2024-03-04T21:00:00Z"),
    ("ru", "3 \u0434\u043d\u044f \u043d\u0430\u0437\u0430\u0434", {"languages": ["ru"]},
     "2024-03-07T12:00:00Z"),
    ("ja", "2024\u5e743\u67085\u65e5", {"languages": ["ja"], "tz": "Asia/Tokyo"},
     "2024-03-04T15:00:00Z"),
    ("ja", "2\u65e5\u524d", {"languages": ["ja"]}, "2024-03-08T12:00:00Z"),
]


def _value(processor: Any, text: Any) -> Any:
    try:
        return processor(text, CTX)
    except ProcessorError:
        return REFUSED


@pytest.mark.parametrize(("locale", "text", "decimal", "expected"), NUMBERS)
def test_numbers_are_right_or_refused(locale: str, text: str, decimal: str,
                                      expected: Any) -> None:
    assert _value(make_float(decimal), text) == expected
    whole = expected if expected == REFUSED or float(expected).is_integer() else REFUSED
    assert _value(make_int(decimal), text) == (whole if whole == REFUSED else int(whole))


def _one(options: dict[str, Any] | str, value: Any, name: str = "price",
         fetched_at: datetime = FETCHED) -> tuple[Any, list[str]]:
    """``value`` through a one-field rule, as the spider extracts and checks it."""
    config = parse_site({"site_id": "s", "version": 1, "start": "detail", "format": "json",
                         "fields": {"v": {"path": "v", "processors": [{name: options}]}}},
                        "t.yaml")
    parsed = extract(config.fields, {"v": value}, CTX.url, fetched_at=fetched_at)
    return parsed.fields["v"], check(config, parsed, now=FETCHED)


@pytest.mark.parametrize(("locale", "text", "options", "amount", "currency"), PRICES)
def test_prices_have_amount_and_currency(locale: str, text: str, options: dict[str, Any],
                                         amount: Any, currency: str | None) -> None:
    value, reasons = _one(options, text)
    if amount == REFUSED:
        assert value is None and len(reasons) == 1 and reasons[0].startswith("v: price: ")
    else:
        assert value == {"amount": amount, "currency": currency} and reasons == []
        assert _one({**options, "part": "amount"}, text)[0] == amount


@pytest.mark.parametrize(("locale", "text", "options", "expected"), DATES)
def test_natural_dates_of_several_languages(locale: str, text: str, options: dict[str, Any],
                                            expected: str) -> None:
    pytest.importorskip("dateparser")
    value, reasons = _one(options, text, "date_natural")
    assert (value, reasons) == (expected, [])


def test_refused_values_are_anomalies_with_the_field_empty() -> None:
    value, reasons = _one({}, "1,2,3", "float")
    assert value is None and reasons == ["v: float: ambiguous separators in '1,2,3'"]
    value, reasons = _one({}, 2**70, "int")
    assert value is None and reasons == [f"v: int: out of the 64-bit range: {2**70}"]
    assert _one({}, "9" * 41, "float")[1] == ["v: float: more than 40 digits"]
    assert _one({}, float("nan"), "float")[1] == ["v: float: not a finite number: nan"]
    assert _one({}, True, "float")[1] == ["v: float: expected text or a number, got True"]
    assert _one({}, "12.5", "int")[1] == ["v: int: not a whole number: 12.5"]


def test_price_constraints_bound_the_amount() -> None:
    config = parse_site({"site_id": "s", "version": 1, "start": "detail", "format": "json",
                         "fields": {"v": {"path": "v", "processors": ["price"], "min": 0}}},
                        "t.yaml")
    parsed = extract(config.fields, {"v": "\u20ac -5,00"}, CTX.url)
    assert check(config, parsed, now=FETCHED) == ["v: below 0 (-5.0)"]


def test_ambiguous_all_digit_dates_need_a_date_order() -> None:
    pytest.importorskip("dateparser")
    value, reasons = _one({"languages": ["en"]}, "05/03/2024", "date_natural")
    assert value is None and "set date_order" in reasons[0]
    assert _one({"languages": ["en"]}, "05/05/2024", "date_natural")[0] == "2024-05-05T00:00:00Z"
    value, reasons = _one({"languages": ["en"]}, "not a date at all", "date_natural")
    assert value is None and reasons == ["v: date_natural: no date in 'not a date at all'"]


def test_natural_dates_default_to_date_constraints() -> None:
    pytest.importorskip("dateparser")
    value, reasons = _one({"languages": ["en"]}, "in 3 days", "date_natural")
    assert value == "2024-03-13T12:00:00Z" and reasons == [f"v: in the future ({value})"]


def test_date_natural_without_dateparser_is_refused_at_load_naming_the_field(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dateparser", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "dateparser.data.languages_info", None)
    with pytest.raises(RuleError) as info:
        _one({"languages": ["fr"]}, "3 janvier 2024", "date_natural")
    assert info.value.path == "fields.v.processors[0]"
    assert "pip install meteorseed-scrapy[dates]" in info.value.problem


@pytest.mark.parametrize(("options", "path", "problem"), [
    ({"languages": ["pt-BR"]}, "fields.v.processors[0].date_natural.languages[0]",
     "no language 'pt-BR'"),
    ({"date_order": "DDD"}, "fields.v.processors[0].date_natural.date_order", "must be one of"),
    ({"tz": "Mars/Olympus"}, "fields.v.processors[0].date_natural.tz", "unknown time zone"),
    ({"locale": "fr"}, "fields.v.processors[0].date_natural.locale", "unknown key"),
])
def test_date_natural_options_are_checked_at_load(options: dict[str, Any], path: str,
                                                  problem: str) -> None:
    pytest.importorskip("dateparser")
    with pytest.raises(RuleError) as info:
        _one(options, "x", "date_natural")
    assert info.value.path == path and problem in info.value.problem


def test_price_options_are_checked_at_load() -> None:
    with pytest.raises(RuleError, match=r"processors\[0\]\.price\.decimal: must be one of"):
        _one({"decimal": ";"}, "1")
    with pytest.raises(RuleError, match=r"processors\[0\]\.price\.part: must be one of"):
        _one({"part": "cents"}, "1")


# -- properties -------------------------------------------------------------------------------

GROUPINGS = {  # decimal separator, thousands separator
    "en": (".", ","), "de": (",", "."), "fr": (",", "\u202f"), "ch": (".", "'"),
    "plain": (".", ""),
}


def _format(number: Decimal, style: str) -> str:
    decimal, group = GROUPINGS[style]
    text = f"{abs(number):,.2f}".replace(",", "\0").replace(".", decimal)
    return ("-" if number < 0 else "") + text.replace("\0", group)


@given(st.decimals(min_value=-10**12, max_value=10**12, places=2, allow_nan=False),
       st.sampled_from(sorted(GROUPINGS)))
def test_formatted_numbers_read_back_exactly(number: Decimal, style: str) -> None:
    text = _format(number, style)
    assert make_float(GROUPINGS[style][0])(f"Price: {text} EUR", CTX) == float(number)


@given(st.text(max_size=60))
def test_any_text_is_a_finite_number_or_refused(text: str) -> None:
    for decimal in (".", ","):
        for processor in (make_float(decimal), make_int(decimal)):
            value = _value(processor, text)
            assert value == REFUSED or (isinstance(value, (int, float))
                                        and math.isfinite(value))
    value, reasons = _one({}, text)
    if value is None:  # refused, or no text at all (then not an anomaly: not required)
        assert len(reasons) == 1 or (reasons == [] and not text.split())
    else:
        assert reasons == [] and math.isfinite(value["amount"])


@given(st.lists(st.sampled_from(["1", "2", "3", "12", "123", "1234"]), min_size=2, max_size=4),
       st.sampled_from([",", "."]))
def test_badly_grouped_digits_are_refused_not_joined(groups: list[str], mark: str) -> None:
    text = mark.join(groups)
    decimal = "." if mark == "," else ","
    western = 1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])
    lakh = mark == "," and len(groups) > 2 and len(groups[0]) <= 2 and all(
        len(g) == 2 for g in groups[1:-1]) and len(groups[-1]) == 3
    expected = float("".join(groups)) if western or lakh else REFUSED
    assert _value(make_float(decimal), text) == expected

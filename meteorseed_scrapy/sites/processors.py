"""Value processors of site rule fields: ``strip``, ``lower``, ``int``, ``float``, ``price``,
``date``, ``date_natural``, ``absolute_url``.

A processor turns one extracted value into its normalised form, or raises
:class:`ProcessorError`; the spider then records the field as empty and the failure as an
anomaly reason (a price that stops parsing is exactly what a redesign looks like). Numbers are
read strictly (:mod:`.numbers`): a value whose separators allow two readings is refused, not
guessed. Processors are compiled once per config version, so parsing a page pays no set-up
cost; their options are declared in :data:`OPTIONS` (the rule format, :mod:`.spec`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from meteorseed_scrapy.sites import dates
from meteorseed_scrapy.sites.numbers import NumberError, read_number, read_price, to_float, to_int
from meteorseed_scrapy.sites.reader import Reader, RuleError
from meteorseed_scrapy.sites.shown import shown
from meteorseed_scrapy.sites.spec import Key, section, string, strings


class ProcessorError(ValueError):
    """A value could not be normalised."""


@dataclass(frozen=True)
class PageContext:
    """What a processor may need beside the value: the page URL (``absolute_url``) and when
    the page was fetched (relative dates of ``date_natural``; None: now)."""

    url: str
    fetched_at: datetime | None = None


Processor = Callable[[Any, PageContext], Any]


def collapse(text: str) -> str:
    """Whitespace runs to one space, ends stripped (split/join: faster than a regex here)."""
    return " ".join(text.split())


def _strip(value: Any, ctx: PageContext) -> Any:
    return collapse(value) if isinstance(value, str) else value


def make_float(decimal: str = ".") -> Processor:
    def process(value: Any, ctx: PageContext) -> float:
        try:
            return to_float(read_number(value, decimal))
        except NumberError as exc:
            raise ProcessorError(str(exc)) from None

    return process


def make_int(decimal: str = ".") -> Processor:
    def process(value: Any, ctx: PageContext) -> int:
        try:
            return to_int(read_number(value, decimal))
        except NumberError as exc:
            raise ProcessorError(str(exc)) from None

    return process


def make_price(decimal: str | None, currency: str | None, part: str) -> Processor:
    """``{"amount": 1299.0, "currency": "€"}`` (or one ``part`` of it) from a price text."""

    def process(value: Any, ctx: PageContext) -> Any:
        try:
            amount, found = read_price(value, decimal, currency)
        except NumberError as exc:
            raise ProcessorError(str(exc)) from None
        if part == "amount":
            return amount
        if part == "currency":
            if found is None:
                raise ProcessorError(f"no currency in {str(value)[:80]!r}")
            return found
        return {"amount": amount, "currency": found}

    return process


def iso_utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_date(formats: tuple[str, ...], zone: ZoneInfo | timezone) -> Processor:
    """Parse with the first matching format (ISO-8601 when none is given); naive times are
    in ``zone``; the result is ISO-8601 UTC (``2024-01-02T03:04:05Z``)."""

    def process(value: Any, ctx: PageContext) -> str:
        if not isinstance(value, str):
            raise ProcessorError(f"expected a date string, got {shown(value)}")
        text = collapse(value)
        moment: datetime | None = None
        for fmt in formats:
            try:
                moment = datetime.strptime(text, fmt)
                break
            except ValueError:
                continue
        if moment is None and not formats:
            try:
                moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                moment = None
        if moment is None:
            tried = ", ".join(formats) or "ISO-8601"
            raise ProcessorError(f"date {text[:60]!r} matches none of: {tried}")
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=zone)
        return iso_utc(moment)

    return process


def make_natural_date(languages: tuple[str, ...], date_order: str | None,
                      zone: tzinfo) -> Processor:
    parse = dates.NaturalDates(languages, date_order, zone)

    def process(value: Any, ctx: PageContext) -> str:
        if not isinstance(value, str):
            raise ProcessorError(f"expected a date string, got {shown(value)}")
        try:
            return iso_utc(parse(collapse(value), ctx.fetched_at or datetime.now(timezone.utc)))
        except dates.DateError as exc:
            raise ProcessorError(str(exc)) from None

    return process


def _absolute_url(value: Any, ctx: PageContext) -> Any:
    if not isinstance(value, str):
        return value
    from urllib.parse import urljoin  # cheap; kept local to make the dependency obvious

    return urljoin(ctx.url, value.strip())


def _lower(value: Any, ctx: PageContext) -> Any:
    return value.lower() if isinstance(value, str) else value


_DECIMAL = string("decimal separator", enum=(".", ","))
_TZ = string("time zone of dates given without one (IANA name)", example="Europe/Berlin")
#: Each processor and its options (the rule format: :mod:`.spec`).
OPTIONS: dict[str, Key] = {
    "strip": section("whitespace runs to one space", {}),
    "lower": section("lower case", {}),
    "absolute_url": section("joined with the page URL", {}),
    "int": section("a whole number; ambiguous separators refused", {"decimal": _DECIMAL}),
    "float": section("a number; ambiguous separators refused", {"decimal": _DECIMAL}),
    "price": section("amount and currency (price-parser)", {
        "decimal": string("decimal separator (default: detected)", enum=(".", ",")),
        "currency": string("currency when the text has none (a hint, e.g. EUR)", example="EUR"),
        "part": string("amount and currency, or one of them", enum=("both", "amount", "currency")),
    }),
    "date": section("strptime formats (ISO-8601 when none)", {
        "formats": strings("strptime formats, tried in order", example=["%d.%m.%Y"]),
        "tz": _TZ}),
    "date_natural": section("natural-language dates (dateparser, the `dates` extra)", {
        "languages": strings("dateparser language codes (default: detected)", example=["fr"]),
        "date_order": string("order of all-digit dates", enum=dates.DATE_ORDERS),
        "tz": _TZ}),
}
NAMES = tuple(OPTIONS)


def compile_processor(spec: Any, reader: Reader, index: int) -> tuple[str, Processor]:
    """``"strip"`` or ``{"date": {"formats": [...], "tz": "Europe/Berlin"}}`` -> a processor."""
    where = f"processors[{index}]"
    if isinstance(spec, str):
        name, raw = spec, None
    elif isinstance(spec, dict) and len(spec) == 1:
        name, raw = next(iter(spec.items()))
    else:
        raise reader.error(where, "expected a processor name or {name: {options}}")
    if name not in OPTIONS:
        raise reader.error(where, f"unknown processor {name!r}; known: {', '.join(NAMES)}")
    path = reader.at(where) if isinstance(spec, str) else f"{reader.at(where)}.{name}"
    options = Reader(raw or {}, reader.source, path, OPTIONS[name])
    processor: Processor
    if name == "strip":
        processor = _strip
    elif name == "lower":
        processor = _lower
    elif name == "absolute_url":
        processor = _absolute_url
    elif name in ("int", "float"):
        decimal = options.string("decimal", ".")
        assert decimal is not None
        processor = make_int(decimal) if name == "int" else make_float(decimal)
    elif name == "price":
        processor = make_price(options.string("decimal"), options.string("currency"),
                               options.string("part", "both") or "both")
    elif name == "date":
        processor = make_date(options.str_list("formats"), _zone(options))
    else:
        processor = _natural_date(reader, where, options)
    options.done()
    return str(name), processor


def _zone(options: Reader) -> ZoneInfo | timezone:
    tz_name = options.string("tz", "UTC")
    assert tz_name is not None
    try:
        return timezone.utc if tz_name == "UTC" else ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise options.error("tz", f"unknown time zone {tz_name!r}") from None


def _natural_date(reader: Reader, where: str, options: Reader) -> Processor:
    try:
        known = dates.known_languages()
    except ImportError:
        raise reader.error(where, f"date_natural {dates.INSTALL_HINT}") from None
    languages = options.str_list("languages")
    for index, code in enumerate(languages):
        if code not in known:
            raise RuleError(options.source, f"{options.at('languages')}[{index}]",
                              f"dateparser knows no language {code!r} (codes such as en, fr,"
                              " pt, zh-Hant)")
    return make_natural_date(languages, options.string("date_order"), _zone(options))

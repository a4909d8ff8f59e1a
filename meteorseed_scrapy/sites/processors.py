"""Value processors of site rule fields: ``strip``, ``int``, ``float``, ``date``, ``absolute_url``.

A processor turns one extracted value into its normalised form, or raises
:class:`ProcessorError`; the spider then records the field as empty and the failure as an
anomaly reason (a price that stops parsing is exactly what a redesign looks like).
Processors are compiled once per config version, so parsing a page pays no set-up cost.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from meteorseed_scrapy.sites.reader import Reader

#: Characters used as thousands separators: comma, (narrow) no-break space, apostrophe, space.
_THOUSANDS = re.compile(r"[,\u00a0\u202f' _]")
_NUMBER = re.compile(r"[-+]?\d[\d,.\u00a0\u202f' _]*")


class ProcessorError(ValueError):
    """A value could not be normalised."""


@dataclass(frozen=True)
class Context:
    """What a processor may need beside the value: the page URL (for ``absolute_url``)."""

    url: str


Processor = Callable[[Any, Context], Any]


def collapse(text: str) -> str:
    """Whitespace runs to one space, ends stripped (split/join: faster than a regex here)."""
    return " ".join(text.split())


def _strip(value: Any, ctx: Context) -> Any:
    return collapse(value) if isinstance(value, str) else value


def _to_number(value: Any, decimal: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ProcessorError(f"expected text, got {value!r}"[:120])
    match = _NUMBER.search(value)  # "Price: 1,299.00 EUR" -> "1,299.00"
    if match is None:
        raise ProcessorError(f"no number in {value[:80]!r}")
    text = match.group(0).strip()
    if decimal == ",":
        text = text.replace(".", "").replace(" ", "")
        text = _THOUSANDS.sub("", text.replace(",", "\0")).replace("\0", ".")
    else:
        text = _THOUSANDS.sub("", text)
    return text


def make_float(decimal: str = ".") -> Processor:
    def process(value: Any, ctx: Context) -> float:
        text = _to_number(value, decimal)
        try:
            return float(text)
        except ValueError:
            raise ProcessorError(f"not a number: {value!r}"[:120]) from None

    return process


def make_int(decimal: str = ".") -> Processor:
    def process(value: Any, ctx: Context) -> int:
        text = _to_number(value, decimal)
        try:
            number = float(text)
        except ValueError:
            raise ProcessorError(f"not a number: {value!r}"[:120]) from None
        if number != int(number):
            raise ProcessorError(f"not a whole number: {value!r}"[:120])
        return int(number)

    return process


def iso_utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_date(formats: tuple[str, ...], zone: ZoneInfo | timezone) -> Processor:
    """Parse with the first matching format (ISO-8601 when none is given); naive times are
    in ``zone``; the result is ISO-8601 UTC (``2024-01-02T03:04:05Z``)."""

    def process(value: Any, ctx: Context) -> str:
        if not isinstance(value, str):
            raise ProcessorError(f"expected a date string, got {value!r}"[:120])
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


def _absolute_url(value: Any, ctx: Context) -> Any:
    if not isinstance(value, str):
        return value
    from urllib.parse import urljoin  # cheap; kept local to make the dependency obvious

    return urljoin(ctx.url, value.strip())


def _lower(value: Any, ctx: Context) -> Any:
    return value.lower() if isinstance(value, str) else value


NAMES = ("strip", "int", "float", "date", "absolute_url", "lower")


def compile_processor(spec: Any, reader: Reader, index: int) -> tuple[str, Processor]:
    """``"strip"`` or ``{"date": {"formats": [...], "tz": "Europe/Berlin"}}`` -> a processor."""
    where = f"processors[{index}]"
    if isinstance(spec, str):
        name, options = spec, Reader({}, reader.source, reader.at(where))
    elif isinstance(spec, dict) and len(spec) == 1:
        name, raw = next(iter(spec.items()))
        options = Reader(raw or {}, reader.source, f"{reader.at(where)}.{name}")
    else:
        raise reader.error(where, "expected a processor name or {name: {options}}")
    processor: Processor
    if name == "strip":
        processor = _strip
    elif name == "lower":
        processor = _lower
    elif name == "absolute_url":
        processor = _absolute_url
    elif name in ("int", "float"):
        decimal = options.string("decimal", ".", choices=(".", ","))
        assert decimal is not None
        processor = make_int(decimal) if name == "int" else make_float(decimal)
    elif name == "date":
        formats = options.str_list("formats")
        tz_name = options.string("tz", "UTC")
        assert tz_name is not None
        try:
            zone: ZoneInfo | timezone = timezone.utc if tz_name == "UTC" else ZoneInfo(tz_name)
        except (ZoneInfoNotFoundError, ValueError):
            raise options.error("tz", f"unknown time zone {tz_name!r}") from None
        processor = make_date(formats, zone)
    else:
        raise reader.error(where, f"unknown processor {name!r}; known: {', '.join(NAMES)}")
    options.done()
    return str(name), processor

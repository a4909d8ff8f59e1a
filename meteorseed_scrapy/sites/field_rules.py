"""A site's field rules and the selectors they and the link rules pick values with, read from
a rule file's mapping and checked at load time: one of css, xpath, path, jmespath or from_url,
compiled now so a bad selector fails when the file loads, not on the first page; field names,
processors and value constraints (dates by default for date processors).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

import jmespath
from parsel import Selector as Parsel

from meteorseed_scrapy.sites import format as rule_keys
from meteorseed_scrapy.sites.model import DEFAULT_NOT_BEFORE, Constraint, FieldRule, Selector
from meteorseed_scrapy.sites.processors import compile_processor
from meteorseed_scrapy.sites.reader import Reader, RuleError
from meteorseed_scrapy.sites.shown import shown

_FIELD_NAME = re.compile(rule_keys.FIELD_NAME)
_EXSLT_REGEX = re.compile(r"\bre\s*:\s*(?:test|match|replace)\s*\(")
_SOURCES = ("css", "xpath", "path", "jmespath")
#: Processors whose output is a date (date constraints apply by default).
_DATE_PROCESSORS = frozenset({"date", "date_natural"})


def _read_selector(sub: Reader, fmt: str) -> Selector:
    """The selector keys of ``sub`` (a field or a link rule); other keys are left to the caller."""
    css, xpath, path, query = (sub.string(key) for key in _SOURCES)
    from_url = sub.flag("from_url", False)
    if [css, xpath, path, query, from_url or None].count(None) != 4:
        raise RuleError(sub.source, sub.path, "needs exactly one of css, xpath, path,"
                          " jmespath, from_url")
    for key, value in (("path", path), ("jmespath", query)):
        if value is not None and fmt != "json":
            raise sub.error(key, "only for format: json sites")
    if (css or xpath) and fmt == "json":
        raise sub.error("css" if css else "xpath", "not for format: json sites (use path or"
                        " jmespath)")
    regex = sub.string("regex")
    if css or xpath:
        check_selector(sub, "css" if css else "xpath", css or xpath or "", xpath=bool(xpath))
    if query is not None:
        try:  # compiled now, so a bad expression fails at load time
            jmespath.compile(query)
        except jmespath.exceptions.JMESPathError as exc:
            raise sub.error("jmespath", f"invalid JMESPath: {exc}"[:300]) from None
    return Selector(css, xpath, path, from_url, sub.string("attr"),
                    sub.pattern("regex", regex) if regex else None, jmespath=query)


def check_selector(reader: Reader, key: str, query: str, xpath: bool = False) -> None:
    """A CSS (or XPath) selector that parsel compiles; else an error naming ``key``."""
    if xpath and _EXSLT_REGEX.search(query):
        # lxml runs these with Python's re: no time bound, the GIL held (sites/patterns.py)
        raise reader.error(key, "EXSLT regular expressions (re:test, re:match, re:replace)"
                                " have no time bound: select the text and use the rule's"
                                " regex key")
    try:  # compiled now, so a bad selector fails at load time, not on the first page
        probe = Parsel(text="<html></html>")
        probe.xpath(query) if xpath else probe.css(query)
    except Exception as exc:
        raise reader.error(key, f"invalid selector: {exc}") from None


def section_selector(reader: Reader, key: str, fmt: str) -> Selector | None:
    """The selector at ``key`` of a section (``list.links``, ``list.items``, ``detail.links``,
    ...), a string being the short form; None when absent."""
    raw = reader.raw(key)
    if raw is None:
        return None
    if isinstance(raw, str):  # shorthand: a CSS selector, or a dotted path for JSON sites
        raw = {"path": raw} if fmt == "json" else {"css": raw}
    sub = reader.reader(key, raw)
    selector = _read_selector(sub, fmt)
    sub.done()
    return selector


def _constraint(reader: Reader, is_date: bool) -> Constraint:
    not_before = DEFAULT_NOT_BEFORE if is_date else None
    raw = reader.raw("not_before")
    if raw is not None:
        try:
            text = raw.isoformat() if hasattr(raw, "isoformat") else str(raw)
            not_before = datetime.fromisoformat(text).replace(tzinfo=timezone.utc)
        except ValueError:
            problem = f"expected a date like 1990-01-01, got {shown(raw)}"
            raise reader.error("not_before", problem) from None
    min_length = reader.number("min_length", None, integer=True)
    max_length = reader.number("max_length", None, integer=True)
    return Constraint(
        min_length=None if min_length is None else int(min_length),
        max_length=None if max_length is None else int(max_length),
        minimum=reader.number("min", None, minimum=float("-inf")),
        maximum=reader.number("max", None, minimum=float("-inf")),
        not_before=not_before,
        not_future=reader.flag("not_future", is_date),
    )


def field_rule(name: str, raw: Any, reader: Reader, fmt: str, required: bool) -> FieldRule:
    """Field ``name`` of ``fields:`` (its mapping, or a selector string), checked."""
    if not _FIELD_NAME.fullmatch(name) or name in rule_keys.RESERVED:
        raise reader.error(name, "invalid or reserved field name")
    if isinstance(raw, str):
        raw = {"path": raw} if fmt == "json" else {"css": raw}
    sub = reader.reader(name, raw)
    select = _read_selector(sub, fmt)
    specs = sub.raw("processors", [])
    if not isinstance(specs, list):
        raise sub.error("processors", "expected a list")
    processors = tuple(compile_processor(spec, sub, i) for i, spec in enumerate(specs))
    is_date = any(pname in _DATE_PROCESSORS for pname, _ in processors)
    text = sub.flag("text", False)
    if text and (select.attr or fmt == "json"):
        raise sub.error("text", "takes the text of HTML elements: not with attr or JSON")
    rule = FieldRule(name=name, select=select, text=text, join=sub.string("join"),
                     many=sub.flag("many", False), processors=processors,
                     required=sub.flag("required", required),
                     constraint=_constraint(sub, is_date))
    sub.done()
    return rule

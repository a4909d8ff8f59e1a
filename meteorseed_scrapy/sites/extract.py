"""Apply a site's field rules to one scope: an HTML element (parsel) or a JSON object.

Every extracted string has its whitespace collapsed; ``text: true`` fields take the text of
the matched elements without script/style/iframe/noscript and without whatever the site's
``detail.remove`` selectors match (navigation, footers, share boxes). The raw text each field
came from is kept next to the parsed value, for sampling and for anomaly reports. JSON pages
are read with dotted ``path``s or ``jmespath`` expressions (as parsel's ``Selector.jmespath``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jmespath
from lxml import etree
from parsel import Selector as Parsel
from parsel.csstranslator import HTMLTranslator

from meteorseed_scrapy.sites.model import FieldRule, Selector
from meteorseed_scrapy.sites.patterns import PatternTimeout
from meteorseed_scrapy.sites.processors import PageContext, ProcessorError, collapse

#: Elements whose content is never text of the page.
DROPPED_TAGS = frozenset({"script", "style", "iframe", "noscript", "template"})
#: Inline elements: no word boundary around them ("<b>para</b>." stays "para.").
INLINE_TAGS = frozenset({"a", "abbr", "b", "cite", "code", "em", "i", "label", "mark", "q", "s",
                         "small", "span", "strong", "sub", "sup", "time", "u"})
_MISSING = object()
RAW_LIMIT = 300  # characters of raw text kept per field (samples and anomaly reports)
_CSS = HTMLTranslator()  # parsel's, so ::text and ::attr(name) mean what they mean there
_EXSLT_RE = {"re": "http://exslt.org/regular-expressions"}  # parsel registers it too


@dataclass
class Parsed:
    fields: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def json_path(data: Any, path: str) -> Any:
    """``"salary.min"`` / ``"jobs.0.id"`` in nested dicts and lists; missing -> None."""
    value = data
    for step in path.split("."):
        if isinstance(value, dict):
            value = value.get(step, _MISSING)
        elif isinstance(value, list) and step.lstrip("-").isdigit() and -len(value) <= int(
                step) < len(value):
            value = value[int(step)]
        else:
            value = _MISSING
        if value is _MISSING:
            return None
    return value


def element_text(node: Any, removed: set[Any]) -> str:
    """Visible text of ``node`` (an lxml element, a string, or a parsel Selector of either):
    dropped tags and ``removed`` elements left out."""
    root = node.root if isinstance(node, Parsel) else node
    if isinstance(root, str):
        return collapse(root)
    parts: list[str] = []

    def walk(element: Any, top: bool) -> None:
        tag = element.tag
        # Comments and processing instructions have a non-string tag: skip their content.
        if isinstance(tag, str) and tag.lower() not in DROPPED_TAGS and element not in removed:
            if element.text:
                parts.append(element.text)
            for child in element:
                walk(child, False)
        if not isinstance(tag, str) or tag.lower() not in INLINE_TAGS:
            parts.append(" ")  # block boundaries: "end.</p><p>Start" must not glue words
        if element.tail and not top:
            parts.append(element.tail)

    walk(root, True)
    return collapse("".join(parts))


def xpath_of(select: Selector) -> str:
    """The XPath of a css/xpath selector (CSS translated the way parsel does)."""
    return _CSS.css_to_xpath(select.css) if select.css else select.xpath or ""


@lru_cache(maxsize=4096)
def compiled(query: str, css: bool, smart: bool = False) -> etree.XPath:
    """A rule's selector as one compiled XPath; ``smart``: strings know their element (for
    links: the ``rel`` of the ``a`` whose ``href`` was selected)."""
    xpath = _CSS.css_to_xpath(query) if css else query
    return etree.XPath(xpath, namespaces=_EXSLT_RE if "re:" in xpath else None,
                       smart_strings=smart)


@lru_cache(maxsize=1024)
def compiled_jmespath(query: str) -> Any:
    return jmespath.compile(query)


def find(scope: Any, select: Selector, smart: bool = False) -> list[Any]:
    """What ``select``'s css/xpath matches in ``scope`` (a parsel Selector or an lxml element):
    elements, strings (``::text``, ``@attr``), or a number/boolean (``count(...)``).

    Same results as ``scope.css(...)`` / ``scope.xpath(...)``, without wrapping every match in a
    parsel Selector: those objects cost more than the XPath evaluation on detail pages."""
    root = scope.root if isinstance(scope, Parsel) else scope
    if not hasattr(root, "xpath"):  # a text node: nothing below it (as in parsel)
        return []
    if select.css:
        found = compiled(select.css, True, smart)(root)
    else:
        found = compiled(select.xpath or "", False, smart)(root)
    return found if isinstance(found, list) else [found]


def json_values(scope: Any, select: Selector) -> list[Any]:
    """What a ``path``/``jmespath`` selector finds in a JSON value: a list is its elements,
    nothing is no value (as parsel's ``Selector.jmespath`` flattens its result)."""
    if select.jmespath is not None:
        try:
            found = compiled_jmespath(select.jmespath).search(scope)
        except jmespath.exceptions.JMESPathError as exc:  # e.g. length() of a number
            raise ProcessorError(f"jmespath: {exc}"[:200]) from None
    else:
        found = json_path(scope, select.path or "")
    return found if isinstance(found, list) else [] if found is None else [found]


def serialise(value: Any) -> str:
    """A match as parsel's ``get()`` gives it: markup for elements, else text."""
    if isinstance(value, str):
        return value
    if value is True or value is False:
        return "1" if value else "0"
    try:
        return etree.tostring(value, method="html", encoding="unicode", with_tail=False)
    except TypeError:
        return str(value)


def select_values(scope: Any, select: Selector, url: str, *, text: bool = False,
                  removed: set[Any] | None = None, first: bool = False) -> list[Any]:
    """Values that ``select`` picks in ``scope`` (a parsel Selector, an lxml element or a JSON
    value)."""
    values: list[Any]
    if select.from_url:
        values = [url]
    elif select.path is not None or select.jmespath is not None:
        values = json_values(scope, select)
    else:
        nodes = find(scope, select)
        if first and select.regex is None:
            nodes = nodes[:1]  # one value is used: do not serialise the others
        if text:
            values = [element_text(node, removed or set()) for node in nodes]
        elif select.attr:
            values = [node.get(select.attr) if hasattr(node, "attrib") else None
                      for node in nodes]
        else:
            values = [serialise(node) for node in nodes]
    if select.regex is not None:
        try:
            values = list(select.regex.first_groups(values))
        except PatternTimeout as exc:  # a time bound, not a stall: the field is an anomaly
            raise ProcessorError(str(exc)) from None
    return [collapse(v) if isinstance(v, str) else v for v in values if v is not None]


def _raw_text(values: Iterable[Any]) -> str:
    return " | ".join(str(v) for v in values)[:RAW_LIMIT]


def extract(rules: Iterable[FieldRule], scope: Any, url: str,
            removed: set[Any] | None = None, fetched_at: datetime | None = None) -> Parsed:
    """Every field of ``rules`` from ``scope``; processor failures become ``problems``.
    ``fetched_at``: when the page was fetched (relative dates count from it; None: now)."""
    parsed = Parsed()
    ctx = PageContext(url, fetched_at)
    for rule in rules:
        try:
            values = select_values(scope, rule.select, url, text=rule.text, removed=removed,
                                   first=not rule.many and rule.join is None)
        except ProcessorError as exc:
            parsed.problems.append(f"{rule.name}: {exc}")
            parsed.fields[rule.name], parsed.raw[rule.name] = None, ""
            continue
        values = [v for v in values if v != ""]
        parsed.raw[rule.name] = _raw_text(values)
        if not rule.many and rule.join is None:
            values = values[:1]  # only the first value is used: do not process the rest
        problem = None
        for name, processor in rule.processors:
            try:
                values = [processor(v, ctx) for v in values]
            except ProcessorError as exc:
                problem = f"{rule.name}: {name}: {exc}"
                break
        if problem is not None:
            parsed.problems.append(problem)
            parsed.fields[rule.name] = None
            continue
        if rule.join is not None:
            parsed.fields[rule.name] = rule.join.join(str(v) for v in values) or None
        elif rule.many:
            parsed.fields[rule.name] = values
        else:
            parsed.fields[rule.name] = values[0] if values else None
    return parsed

"""The rule format is declared once (sites/format.py): the validator and the JSON Schema of
``meteorseed sites schema`` accept the same keys, and every value the validator accepts, the
schema accepts too."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.sites.format import SELECTOR as SELECTOR_KEYS
from meteorseed_scrapy.sites.processors import OPTIONS
from meteorseed_scrapy.sites.reader import Reader, RuleError
from meteorseed_scrapy.sites.schema import FORMAT, parse_site, rule_schema
from meteorseed_scrapy.sites.spec import Key, UndeclaredKey

jsonschema = pytest.importorskip("jsonschema")
EXAMPLES = Path(__file__).resolve().parents[1] / "example_project" / "sites"
SOURCES = ("css", "xpath", "path", "jmespath", "from_url")
VALIDATOR = jsonschema.Draft202012Validator(rule_schema())


def base(fmt: str = "html") -> dict[str, Any]:
    if fmt == "json":
        return {"site_id": "s", "version": 1, "format": "json", "list": {"links": "next"},
                "fields": {"title": "title", "content": "content"}}
    return {"site_id": "s", "version": 1, "list": {"links": "a::attr(href)"},
            "fields": {"title": "h1::text", "content": "p::text"}}


def leaves(key: Key, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, example) of every declared leaf; fields as fields.title, processors' options as
    fields.title.processors.<name>.<option>."""
    if key.keys is not None:
        for name, sub in key.keys.items():
            yield from leaves(sub, (*path, name))
    elif key.values is not None:
        yield from leaves(key.values, (*path, "title"))
    elif key.variants is not None:
        for name, options in key.variants.items():
            yield (*path, name), None
            for option, sub in (options.keys or {}).items():
                yield (*path, name, option), sub.example
    else:
        yield path, key.example


def document(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A valid rule file (or so the test expects) that sets ``path`` to ``value``."""
    fmt = "json" if path[-1] in ("path", "jmespath") or "jmespath" in path else "html"
    doc = base(fmt)
    if path[:2] == ("list", "items"):
        doc["unique_key"] = "title"
    if path[-1] == "wait_for":
        doc[path[0]] = {"mode": "browser"}
    if "processors" in path:
        at = path.index("processors")
        spec: Any = path[at + 1] if len(path) == at + 2 else {path[at + 1]: {path[-1]: value}}
        value, path = [spec], path[:at + 1]
    node: Any = doc
    for step in path[:-1]:
        current = node.get(step)
        if isinstance(current, str):  # a selector shorthand: a css (or path) mapping
            current = {"path" if fmt == "json" else "css": current}
        node[step] = current = dict(current or {})
        node = current
    if path[-1] in SOURCES:  # exactly one source per selector
        for source in SOURCES:
            node.pop(source, None)
    elif path[-1] in SELECTOR_KEYS and not any(source in node for source in SOURCES):
        node["path" if fmt == "json" else "css"] = "a"  # a modifier needs a source
    node[path[-1]] = value
    if len(path) >= 2 and path[-1] in ("attr", "text") and path[0] == "fields":
        node.pop("text" if path[-1] == "attr" else "attr", None)
    return doc


LEAVES = list(leaves(FORMAT))


def test_every_key_is_declared_once_and_reached() -> None:
    paths = {".".join(path) for path, _ in LEAVES}
    for expected in ("site_id", "fields.title.jmespath", "follow.skip_nofollow",
                     "fields.title.processors.price.currency", "limits.quota_key",
                     "list.pagination.regex", "rendering.wait_for"):
        assert expected in paths
    assert set(OPTIONS) <= {path[3] for path, _ in LEAVES if path[2:3] == ("processors",)}


@pytest.mark.parametrize(("path", "value"), LEAVES, ids=[".".join(p) for p, _ in LEAVES])
def test_every_declared_key_is_accepted_by_both(path: tuple[str, ...], value: Any) -> None:
    if "date_natural" in path:
        pytest.importorskip("dateparser")
    doc = document(path, value)
    parse_site(doc, "t.yaml")  # the validator takes it
    assert list(VALIDATOR.iter_errors(doc)) == []


SECTIONS = ["", "list", "list.links", "detail", "follow", "fields.title", "limits", "render",
            "dedup", "sampling", "quality", "fields.title.processors.date"]


@pytest.mark.parametrize("section", SECTIONS)
def test_an_undeclared_key_is_refused_by_both(section: str) -> None:
    path = tuple(section.split(".")) if section else ()
    if path and path[-1] == "date":
        doc = document((*path, "tz"), "UTC")
        doc["fields"]["title"]["processors"][0]["date"]["bogus"] = 1
        where = "fields.title.processors[0].date.bogus"
    else:
        doc = document((*path, "bogus"), 1) if path else {**base(), "bogus": 1}
        where = ".".join((*path, "bogus"))
    with pytest.raises(RuleError) as info:
        parse_site(doc, "t.yaml")
    assert (info.value.path, info.value.problem) == (where, "unknown key")
    assert not VALIDATOR.is_valid(doc)


def test_the_validator_cannot_read_an_undeclared_key() -> None:
    reader = Reader({"a": 1}, "t.yaml", spec=FORMAT)
    with pytest.raises(UndeclaredKey, match="'bogus'"):
        reader.raw("bogus")
    assert reader.spec_of("limits") is FORMAT.keys["limits"]  # type: ignore[index]


def test_schema_is_valid_and_the_example_files_match_it() -> None:
    jsonschema.Draft202012Validator.check_schema(rule_schema())
    for path in sorted(EXAMPLES.iterdir()):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert list(VALIDATOR.iter_errors(data)) == [], path.name


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(
    allow_nan=False, allow_infinity=False, width=32) | st.text(max_size=8) | st.sampled_from(
    ["h1", "1d", "html", "json", "browser", "mark", "title", "x.y", "::", "[", "UTC"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["css", "path", "mode", "x"]), inner, max_size=2), max_leaves=6)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(LEAVES), JSON, st.booleans()), min_size=1,
                max_size=4))
def test_what_the_validator_accepts_the_schema_accepts(changes: list[Any]) -> None:
    """Random keys set to their example or to random JSON: whenever the validator takes the
    file, the published schema must take it too (it is never stricter)."""
    doc = base()
    for (path, example), junk, keep_example in changes:
        update = document(path, example if keep_example else junk)
        doc = _merge(doc, update)
    try:
        parse_site(copy.deepcopy(doc), "t.yaml")
    except RuleError:
        return
    errors = [e.message for e in VALIDATOR.iter_errors(doc)]
    assert errors == [], doc


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for key, value in new.items():
            out[key] = _merge(old.get(key), value) if key in old else value
        return out
    return new

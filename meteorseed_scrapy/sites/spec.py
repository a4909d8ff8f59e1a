"""The rule-file format declared once: each key, its JSON Schema, and its own keys.

The validator (:mod:`.schema`, through :class:`~meteorseed_scrapy.sites.reader.Reader`) reads
a mapping only through the keys declared here: reading an undeclared key is a programming error
(:class:`UndeclaredKey`), an unread key in a file is refused as unknown, and ``enum`` choices
come from here. ``meteorseed sites schema`` prints :func:`json_schema` of the same tree, so the
published JSON Schema and the validator cannot list different keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class UndeclaredKey(AssertionError):
    """The validator read a key that the format does not declare."""


@dataclass(frozen=True)
class Key:
    """One value of the format: a leaf (``schema``), a mapping with declared ``keys``, a map of
    free names to ``values``, or a list of named ``variants`` (``name`` or ``{name: options}``)."""

    schema: Mapping[str, Any] | None = None
    doc: str = ""
    keys: Mapping[str, Key] | None = None
    values: Key | None = None
    names: Mapping[str, Any] | None = None  # JSON Schema of the names of a `values` map
    variants: Mapping[str, Key] | None = None
    required: tuple[str, ...] = ()
    shorthand: Mapping[str, Any] | None = None  # a scalar taken in place of the mapping
    enum: tuple[str, ...] = ()
    example: Any = None

    def sub(self, key: str) -> Key | None:
        """The declaration of ``key`` in this mapping (None: this mapping is not declared)."""
        if self.values is not None:
            return self.values
        if self.keys is None:
            return None
        try:
            return self.keys[key]
        except KeyError:
            raise UndeclaredKey(f"the validator reads {key!r}, which sites/format.py does not"
                                " declare") from None


def string(doc: str, *, enum: tuple[str, ...] = (), pattern: str | None = None,
         example: Any = None) -> Key:
    schema: dict[str, Any] = {"type": "string"}
    if pattern is not None:
        schema["pattern"] = pattern
    return Key(schema, doc, enum=enum, example=example if example is not None else
               (enum[0] if enum else "x"))


def _bounds(schema: dict[str, Any], minimum: float | None, maximum: float | None
            ) -> dict[str, Any]:
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def number(doc: str, *, minimum: float | None = None, maximum: float | None = None,
           whole: bool = False, example: Any = 1) -> Key:
    """A number, or its decimal text (``"5"``), as the validator's number reading accepts."""
    kind = "integer" if whole else "number"
    return Key({"anyOf": [_bounds({"type": kind}, minimum, maximum),
                          {"type": "string", "description": "the number as decimal text"}]},
               doc, example=example)


def flag(doc: str, example: bool = True) -> Key:
    return Key({"type": "boolean"}, doc, example=example)


def duration(doc: str) -> Key:
    return Key({"anyOf": [{"type": "number", "minimum": 0},
                          {"type": "string", "description": "45s, 30m, 2h, 1d, 2w, 1h30m"}]},
               doc, example="1d")


def strings(doc: str, example: Any = None) -> Key:
    """A list of non-empty strings (one string is a list of one)."""
    item = {"type": "string", "minLength": 1}
    return Key({"anyOf": [item, {"type": "array", "items": item}]}, doc,
               example=example if example is not None else ["x"])


def string_map(doc: str) -> Key:
    return Key({"type": "object", "additionalProperties": {"type": "string", "minLength": 1}},
               doc, example={"Accept-Language": "en"})


def anything(doc: str, schema: Mapping[str, Any] | None = None, example: Any = None) -> Key:
    return Key(schema or {}, doc, example=example)


def section(doc: str, keys: Mapping[str, Key], *, required: tuple[str, ...] = (),
            shorthand: Mapping[str, Any] | None = None) -> Key:
    return Key(None, doc, keys=keys, required=required, shorthand=shorthand)


def _optional(schema: dict[str, Any]) -> dict[str, Any]:
    """Absent and null mean the same to the validator."""
    doc = schema.pop("description", None)
    out: dict[str, Any] = {"anyOf": [{"type": "null"}, schema]}
    if doc:
        out["description"] = doc
    return out


def json_schema(key: Key) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12 keywords) of ``key`` and everything below it."""
    out: dict[str, Any]
    if key.keys is not None:
        out = {"type": "object", "properties": {
            name: json_schema(sub) if name in key.required else _optional(json_schema(sub))
            for name, sub in key.keys.items()}, "additionalProperties": False}
        if key.required:
            out["required"] = list(key.required)
    elif key.values is not None:
        out = {"type": "object", "additionalProperties": json_schema(key.values)}
        if key.names is not None:
            out["propertyNames"] = dict(key.names)
    elif key.variants is not None:
        out = {"type": "array", "items": {"anyOf": [
            {"enum": list(key.variants)},
            *({"type": "object", "properties": {name: _optional(json_schema(options))},
               "required": [name], "additionalProperties": False}
              for name, options in key.variants.items())]}}
    else:
        out = dict(key.schema or {})
    if key.enum:
        out["enum"] = list(key.enum)
    if key.shorthand is not None:
        out = {"anyOf": [dict(key.shorthand), out]}
    if key.doc:
        out["description"] = key.doc
    return out


__all__ = ["Key", "UndeclaredKey", "anything", "duration", "flag", "json_schema", "number",
           "section", "string", "string_map", "strings"]

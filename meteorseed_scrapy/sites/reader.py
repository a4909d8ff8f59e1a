"""Typed, path-aware reading of a parsed config mapping.

Every problem is reported as :class:`RuleError` naming the file, the field path
(``fields.price.processors[1].float``) and what is wrong, and unknown keys are rejected, so a
typo such as ``pagnation`` fails loudly instead of being ignored. With a ``spec`` (a
:class:`~meteorseed_scrapy.sites.spec.Key` of the format), only declared keys may be read and
string choices come from the declaration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meteorseed_scrapy import validators
from meteorseed_scrapy.sites.patterns import RulePattern, compile_pattern
from meteorseed_scrapy.sites.shown import shown
from meteorseed_scrapy.sites.spec import Key

#: Words YAML 1.1 reads as booleans when unquoted; a choice among them needs quotes.
_YAML_BOOLEAN_WORDS = frozenset({"off", "on", "yes", "no", "true", "false"})


class RuleError(validators.ConfigError):
    """A site rule config is invalid: ``source`` (file), ``path`` (field path) and ``problem``;
    one of the :class:`~meteorseed_scrapy.validators.ConfigError` family, named by file and
    field path."""

    def __init__(self, source: str, path: str, problem: str) -> None:
        super().__init__(f"{source}: {path or '<top>'}", problem)
        self.source, self.path = source, path

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.source, self.path, self.problem)


class Reader:
    """One mapping of a config, at ``path`` within ``source``."""

    def __init__(self, data: Any, source: str, path: str = "", spec: Key | None = None) -> None:
        if not isinstance(data, Mapping):
            raise RuleError(source, path, f"expected a mapping, got {type(data).__name__}")
        self.data, self.source, self.path, self.spec = data, source, path, spec
        self._used: set[str] = set()

    def spec_of(self, key: str) -> Key | None:
        """The declaration of ``key`` (:class:`~.spec.UndeclaredKey` when it has none)."""
        return None if self.spec is None else self.spec.sub(key)

    def reader(self, key: str, value: Any) -> Reader:
        """A reader of ``value``, the mapping found at ``key``."""
        return Reader(value, self.source, self.at(key), self.spec_of(key))

    def section(self, key: str) -> Reader:
        """The mapping at ``key``, or an empty one when absent (its defaults apply)."""
        return self.child(key) or Reader({}, self.source, self.at(key), self.spec_of(key))

    def at(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | int, problem: str) -> RuleError:
        return RuleError(self.source, self.at(key), problem)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        self.spec_of(key)
        self._used.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def child(self, key: str, *, required: bool = False) -> Reader | None:
        value = self.raw(key)
        if value is None:
            if required:
                raise self.error(key, "is required")
            return None
        return self.reader(key, value)

    def string(self, key: str, default: str | None = None, *, required: bool = False,
               choices: tuple[str, ...] = (), numbers: bool = False) -> str | None:
        value = self.raw(key)
        if value is None:
            if required:
                raise self.error(key, "is required")
            return default
        if numbers and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # YAML reads `version: 3` as a number; a string is meant
        declared = self.spec_of(key)
        choices = choices or (declared.enum if declared is not None else ())
        if isinstance(value, bool) and any(c in _YAML_BOOLEAN_WORDS for c in choices):
            # YAML 1.1 reads an unquoted off/on/yes/no as a boolean
            raise self.error(key, f"got the boolean {shown(value)}: YAML reads an unquoted "
                             f"off/on/yes/no as one; quote the word (\"off\")")
        if not isinstance(value, str) or (required and not value.strip()):
            raise self.error(key, f"expected a non-empty string, got {shown(value)}")
        if choices and value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {shown(value)}")
        return value

    def number(self, key: str, default: float | None, *, minimum: float = 0,
               integer: bool = False) -> float | None:
        value = self.raw(key)
        if value is None:
            return default
        try:
            if integer:
                return validators.to_integer(value, self.at(key), minimum=minimum)
            return validators.to_number(value, self.at(key), minimum=minimum)
        except validators.ConfigError as exc:
            raise self.error(key, exc.problem) from None

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {shown(value)}")
        return value

    def duration(self, key: str, default: float | None) -> float | None:
        """Seconds, from a number or ``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"``
        (:func:`meteorseed_scrapy.validators.parse_duration`)."""
        value = self.raw(key)
        if value is None:
            return default
        try:
            return validators.parse_duration(value, self.at(key))
        except validators.ConfigError as exc:
            raise self.error(key, exc.problem) from None

    def str_list(self, key: str) -> tuple[str, ...]:
        value = self.raw(key)
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of strings, got {type(value).__name__}")
        for index, element in enumerate(value):
            if not isinstance(element, str) or not element:
                raise RuleError(self.source, f"{self.at(key)}[{index}]",
                                  f"expected a non-empty string, got {shown(element)}")
        return tuple(value)

    def str_map(self, key: str) -> dict[str, str]:
        child = self.child(key)
        if child is None:
            return {}
        out = {}
        for name in child.data:
            value = child.string(str(name), required=True)
            assert value is not None
            out[str(name)] = value
        return out

    def pattern(self, key: str, value: str) -> RulePattern:
        try:
            return compile_pattern(value)
        except ValueError as exc:
            shown = value if len(value) <= 200 else value[:197] + "..."
            raise self.error(key, f"invalid regular expression {shown!r}: {exc}") from None

    def done(self) -> None:
        """Reject keys nobody read: almost always a typo."""
        unknown = sorted(str(key) for key in self.data if key not in self._used)
        if unknown:
            raise self.error(unknown[0], "unknown key" + (
                f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""))

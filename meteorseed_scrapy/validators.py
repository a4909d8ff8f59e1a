"""How a value given as a number, a flag or text becomes a checked one: finite numbers, whole
numbers, flags and the one duration grammar, each refusing anything else with a
:class:`ConfigError` naming the setting, option or field.

Settings (:mod:`meteorseed_scrapy.settings`), site rule files, seed schedules and CLI options all
read their values through these. It imports nothing of the package.
"""

from __future__ import annotations

import math
import re
from typing import Any


class ConfigError(ValueError):
    """An invalid value: ``name`` (a setting, option or field) and ``problem``. Raised where
    Scrapy would otherwise quietly switch a component off (``NotConfigured``)."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"{name}: {problem}")
        self.name, self.problem = name, problem

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.name, self.problem)


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_AMOUNT = r"(\d+(?:\.\d*)?|\.\d+)"
#: Seconds per duration unit, largest first: the order parts of a duration must come in.
UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile("".join(rf"(?:{_AMOUNT}\s*{unit}\s*)?" for unit in UNITS), re.ASCII)


INT64_MAX = 2**63 - 1


def _shown(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > 256:  # repr of >4300 digits raises
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _parse_number(value: Any, name: str) -> float | int:
    """A finite number from a number or its decimal text (what ``-s NAME=VALUE`` gives)."""
    number: float | int
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(name, f"expected a number, got {_shown(value)}")
    if isinstance(value, str):
        text = value.strip()
        if not _NUMBER.fullmatch(text):
            raise ConfigError(name, f"expected a number, got {_shown(value)}")
        # (int() of thousands of digits raises; such a number is out of any range anyway)
        number = int(text) if text.lstrip("+-").isdigit() and len(text) < 100 else float(text)
    else:
        number = value
    if isinstance(number, int):  # math.isfinite() overflows on ints past 1e308; ints are finite
        return number
    if not math.isfinite(number):
        raise ConfigError(name, f"expected a finite number, got {_shown(value)}")
    return number


def _bounded(number: float, value: Any, name: str, minimum: float, positive: bool,
             maximum: float | None) -> None:
    if positive and number <= 0:
        raise ConfigError(name, f"must be > 0, got {_shown(value)}")
    if number < minimum:
        raise ConfigError(name, f"must be >= {minimum:g}, got {_shown(value)}")
    if maximum is not None and number > maximum:
        raise ConfigError(name, f"must be <= {maximum:g}, got {_shown(value)}")


def to_number(value: Any, name: str, *, minimum: float = 0.0, positive: bool = False,
              maximum: float | None = None) -> float:
    """``value`` as a finite float within ``[minimum, maximum]`` (``> 0`` with ``positive``);
    :class:`ConfigError` naming ``name`` otherwise (nan, inf, text that is not a number)."""
    parsed = _parse_number(value, name)
    try:
        number = float(parsed)
    except OverflowError:
        raise ConfigError(name, f"is too large: {_shown(value)}") from None
    _bounded(number, value, name, minimum, positive, maximum)
    return number


def to_integer(value: Any, name: str, *, minimum: float = 0, maximum: float | None = None
               ) -> int:
    """``value`` as a whole number within ``[minimum, maximum]``; :class:`ConfigError`
    naming ``name`` otherwise (``1.5`` is refused, ``2.0`` is 2)."""
    number = _parse_number(value, name)
    if isinstance(number, float):
        if not number.is_integer():
            raise ConfigError(name, f"expected a whole number, got {_shown(value)}")
        number = int(number)
    # Redis and Lua count in signed 64 bits: a larger whole number is never meant.
    _bounded(number, value, name, minimum, False, INT64_MAX if maximum is None else maximum)
    return number


def parse_duration(value: Any, name: str, *, minimum: float = 0.0, positive: bool = False,
                   maximum: float | None = None) -> float:
    """Seconds from a number of seconds or a duration: ``45s``, ``30m``, ``1.5h``, ``1d``,
    ``2w``, or parts of them largest first (``1h30m``, ``1d 12h``). The one grammar of every
    duration: settings, seed schedules, site rule files and CLI options. Never negative;
    :class:`ConfigError` naming ``name`` for anything else."""
    expected = ("expected seconds or a duration like 45s, 30m, 2h, 1d, 2w or 1h30m, got "
                + _shown(value))
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(name, expected)
    if isinstance(value, str) and not _NUMBER.fullmatch(value.strip()):
        match = _DURATION.fullmatch(value.strip())
        if match is None or not any(match.groups()):
            raise ConfigError(name, expected)
        seconds = sum(float(amount) * size for amount, size
                      in zip(match.groups(), UNITS.values(), strict=True) if amount)
        if not math.isfinite(seconds):
            raise ConfigError(name, f"is too long: {_shown(value)}")
    else:
        try:
            seconds = float(_parse_number(value, name))
        except OverflowError:
            raise ConfigError(name, f"is too long: {_shown(value)}") from None
    _bounded(seconds, value, name, max(0.0, minimum), positive, maximum)
    return seconds


def format_duration(seconds: float) -> str:
    """``5400`` -> ``"1h30m"``: how logs and the CLI show durations (:func:`parse_duration`
    reads it back, to the second)."""
    rest = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    if rest or not parts:
        parts.append(f"{rest}s")
    return "".join(parts)


_FLAGS = {"1": True, "true": True, "0": False, "false": False}


def to_flag(value: Any, name: str) -> bool:
    """True/False, 1/0 or their text (what Scrapy's ``getbool`` takes); else ConfigError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _FLAGS:
        return _FLAGS[value.strip().lower()]
    raise ConfigError(name, f"expected true or false (1 or 0), got {_shown(value)}")

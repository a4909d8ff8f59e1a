"""A value as an error message may show it: a bounded ``repr``.

A rule file's value may be huge (a YAML alias expands to a shared structure as large as it
likes) and a page's value too; ``f"{value!r}"[:200]`` formats all of it before cutting.
:func:`shown` never looks at more than a few levels and elements."""

from __future__ import annotations

import reprlib
from typing import Any

_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = 100
_REPR.maxother = 120
_REPR.maxlong = 60
for _name in ("maxdict", "maxlist", "maxtuple", "maxset", "maxfrozenset", "maxdeque",
              "maxarray"):
    setattr(_REPR, _name, 6)


def shown(value: Any) -> str:
    """``repr(value)``, cut to about 200 characters without formatting the rest."""
    text = _REPR.repr(value)  # bounded by the limits above: cutting it costs nothing
    return text if len(text) <= 200 else text[:197] + "..."


__all__ = ["shown"]

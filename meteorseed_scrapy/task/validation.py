"""Field checks of the task value objects: a failure is a :class:`TaskError` naming the field."""

from __future__ import annotations

import json
import re
from typing import Any

from meteorseed_scrapy.task.lanes import LANES

ID_MAX = 200
_SPACE = re.compile(r"\s")  # the characters str.isspace() accepts, found in C, not in Python


class TaskError(ValueError):
    """A task or seed failed validation; ``field`` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TaskError(name, f"must be a non-empty string, got {value!r}"[:300])
    if len(value) > ID_MAX or _SPACE.search(value):
        raise TaskError(name, f"must be at most {ID_MAX} characters without spaces")
    return value


def check_url(value: Any, name: str = "url") -> str:
    """Return ``value`` if it is an absolute http(s) URL, else raise :class:`TaskError`."""
    if not isinstance(value, str) or not value:
        raise TaskError(name, f"must be a non-empty string, got {value!r}"[:300])
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise TaskError(name, f"must be an http(s) URL, got {value[:200]!r}")
    host = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if not host or _SPACE.search(value):
        raise TaskError(name, f"is not a valid URL: {value[:200]!r}")
    return value


def check_lane(value: Any) -> None:
    if value not in LANES:
        raise TaskError("lane", f"must be one of {', '.join(LANES)}, got {value!r}"[:300])


def check_json_safe(name: str, value: Any) -> None:
    """Raise :class:`TaskError` naming ``name`` unless ``value`` encodes as strict JSON in UTF-8
    (the one check of task ``meta``/``cb_kwargs``, whether set directly or by a yielded request).
    """
    try:
        # ensure_ascii=False + encode: a lone surrogate fails here, not later in to_message().
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TaskError(name, f"is not JSON-serialisable ({exc}): {value!r}"[:300]) from None


__all__ = ["ID_MAX", "TaskError", "check_id", "check_json_safe", "check_lane", "check_url"]

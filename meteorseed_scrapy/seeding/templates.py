"""``url_template`` and ``keywords`` seeds: URLs generated lazily from a template.

A template names its parameters in braces (``https://s/list?page={page}``). Each parameter is
a range of integers (``{"start": 1, "stop": 100, "step": 1}``, stop included), a range of dates
(``{"start": "2024-01-01", "stop": "2024-01-31", "format": "%Y-%m-%d", "step_days": 1}``) or
a list (``{"values": [...]}``); several parameters expand to their cartesian product. The count
is known before anything is generated, so a template beyond :data:`MAX_EXPANSION` is rejected
as a whole with the count in the reason.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from meteorseed_scrapy.task.validation import TaskError, check_known_keys

#: Most URLs one template or keyword seed may expand to.
MAX_EXPANSION = 1_000_000
MAX_TEMPLATE_BYTES = 2048
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
#: The fields of a parameter, by its kind (a misspelt ``step`` must not mean a step of 1).
LIST_FIELDS = frozenset({"values"})
DATE_RANGE_FIELDS = frozenset({"start", "stop", "format", "step_days"})
INT_RANGE_FIELDS = frozenset({"start", "stop", "step"})


def _int(spec: Mapping[str, Any], key: str, path: str, default: int | None = None) -> int:
    value = spec.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TaskError(f"{path}.{key}", f"must be an integer, got {value!r}"[:200])
    return value


def _param_values(name: str, spec: Any) -> Sequence[str]:
    """The values of one parameter as a lazy sequence (a range maps to strings on access)."""
    path = f"payload.params.{name}"
    if not isinstance(spec, Mapping):
        raise TaskError(path, "must be an object")
    if "values" in spec:
        check_known_keys(spec, LIST_FIELDS, path, "a field of a list parameter")
        values = spec["values"]
        if not isinstance(values, list) or not all(isinstance(v, (str, int)) for v in values):
            raise TaskError(f"{path}.values", "must be a list of strings or integers")
        return [quote(str(v), safe="") for v in values]
    start = spec.get("start")
    if isinstance(start, str):
        check_known_keys(spec, DATE_RANGE_FIELDS, path, "a field of a date range")
        return _date_values(spec, path)
    check_known_keys(spec, INT_RANGE_FIELDS, path, "a field of an integer range")
    step = _int(spec, "step", path, 1)
    if step == 0:
        raise TaskError(f"{path}.step", "must not be 0")
    first, stop = _int(spec, "start", path), _int(spec, "stop", path)
    return _Mapped(range(first, stop + (1 if step > 0 else -1), step))


def _date_values(spec: Mapping[str, Any], path: str) -> Sequence[str]:
    fmt = spec.get("format", "%Y-%m-%d")
    if not isinstance(fmt, str):
        raise TaskError(f"{path}.format", "must be a strftime format string")
    try:
        first = dt.date.fromisoformat(spec["start"])
        last = dt.date.fromisoformat(str(spec.get("stop")))
    except ValueError as exc:
        raise TaskError(path, f"start/stop must be YYYY-MM-DD dates ({exc})") from None
    step = _int(spec, "step_days", path, 1)
    if step < 1:
        raise TaskError(f"{path}.step_days", "must be at least 1")
    days = range(0, (last - first).days + 1, step)
    return _Mapped(days, lambda d: quote((first + dt.timedelta(days=d)).strftime(fmt), safe=""))


class _Mapped(Sequence[str]):
    """``range`` values turned into strings when read: a million pages cost no memory."""

    def __init__(self, values: range, fn: Any = str) -> None:
        self._values = values
        self._fn = fn

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, index: Any) -> Any:
        return self._fn(self._values[index])


def _check_template(payload: Mapping[str, Any], key: str) -> str:
    template = payload.get(key)
    if not isinstance(template, str) or not template:
        raise TaskError(f"payload.{key}", "must be a non-empty string")
    if len(template.encode("utf-8")) > MAX_TEMPLATE_BYTES:
        raise TaskError(f"payload.{key}", f"is longer than {MAX_TEMPLATE_BYTES} bytes")
    return template


def plan_template(payload: Mapping[str, Any]) -> tuple[str, list[str], list[Sequence[str]]]:
    """Check a ``url_template`` payload: (template, names, values per name); raises TaskError."""
    template = _check_template(payload, "template")
    params = payload.get("params")
    if not isinstance(params, Mapping) or not params:
        raise TaskError("payload.params", "must be a non-empty object")
    names = list(dict.fromkeys(_PLACEHOLDER.findall(template)))
    unknown = [n for n in names if n not in params]
    if unknown:
        raise TaskError("payload.template", f"uses {{{unknown[0]}}}, which params do not define")
    unused = [n for n in params if n not in names]
    if unused:
        raise TaskError(f"payload.params.{unused[0]}", "is not used by the template")
    values = [_param_values(n, params[n]) for n in names]
    count = 1
    for v in values:
        count *= len(v)
    if count > MAX_EXPANSION:
        raise TaskError("payload.params", f"would expand to {count} URLs, more than the limit "
                        f"of {MAX_EXPANSION} per seed")
    return template, names, values


def expand_template(payload: Mapping[str, Any]) -> Iterator[str]:
    template, names, values = plan_template(payload)
    parts = _PLACEHOLDER.split(template)  # literal, name, literal, name, ...
    for combo in itertools.product(*(range(len(v)) for v in values)):
        chosen = {n: values[i][j] for i, (n, j) in enumerate(zip(names, combo, strict=True))}
        yield "".join(p if k % 2 == 0 else chosen[p] for k, p in enumerate(parts))


def plan_keywords(payload: Mapping[str, Any]) -> tuple[str, list[Any]]:
    template = _check_template(payload, "search_template")
    if "{keyword}" not in template:
        raise TaskError("payload.search_template", "must contain {keyword}")
    keywords = payload.get("keywords")
    if not isinstance(keywords, list):
        raise TaskError("payload.keywords", "must be a list of strings")
    if len(keywords) > MAX_EXPANSION:
        raise TaskError("payload.keywords", f"has more than {MAX_EXPANSION} keywords")
    return template, keywords


def expand_keywords(payload: Mapping[str, Any]) -> Iterator[str | TaskError]:
    """One URL per keyword, URL-encoded (a bad keyword yields a TaskError at its position)."""
    template, keywords = plan_keywords(payload)
    for keyword in keywords:
        if not isinstance(keyword, str) or not keyword.strip():
            yield TaskError("keyword", f"must be a non-empty string, got {keyword!r}"[:200])
            continue
        yield template.replace("{keyword}", quote(keyword, safe=""))

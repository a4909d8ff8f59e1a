"""Meta values that are not JSON but are carried all the same, as tagged JSON objects.

scrapy-playwright's ``PageMethod`` (``meta["playwright_page_methods"]``) travels as
``{"$meteorseed": "PageMethod", "method": "click", "args": [...], "kwargs": {...}}`` and is
rebuilt into a ``PageMethod`` by the worker that fetches the task. Any other value that is not
JSON is refused at yield time with its key named. The tag key is reserved: a meta value that
holds it as a plain key is refused too, so that a tagged object always means one thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meteorseed_scrapy.task.json_depth import MAX_DEPTH, TOO_DEEP
from meteorseed_scrapy.task.validation import TaskError, check_known_keys

TAG = "$meteorseed"
PAGE_METHOD = "PageMethod"
_PAGE_METHOD_KEYS = frozenset({TAG, "method", "args", "kwargs"})


def encode_tagged(path: str, value: Any, depth: int = 0) -> Any:
    """``value`` with every ``PageMethod`` replaced by its tagged form."""
    if depth > MAX_DEPTH:
        raise TaskError(path, TOO_DEEP)
    if _is_page_method(value):
        if not isinstance(value.method, str):
            raise TaskError(path, f"PageMethod {value.method!r} can only travel by method "
                                  "name, not as a callable"[:300])
        return {TAG: PAGE_METHOD, "method": value.method,
                "args": [encode_tagged(f"{path}.args", a, depth + 1) for a in value.args],
                "kwargs": {k: encode_tagged(f"{path}.kwargs.{k}", v, depth + 1)
                           for k, v in value.kwargs.items()}}
    if isinstance(value, Mapping):
        if TAG in value:
            raise TaskError(f"{path}.{TAG}", "is a reserved key (tagged values)")
        return {k: encode_tagged(f"{path}.{k}", v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_tagged(f"{path}[{i}]", v, depth + 1) for i, v in enumerate(value)]
    return value


def decode_tagged(path: str, value: Any) -> Any:
    """``value`` (JSON, already checked for depth) with its tagged objects rebuilt."""
    if isinstance(value, Mapping):
        if TAG in value:
            return _page_method(path, value)
        return {k: decode_tagged(f"{path}.{k}", v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_tagged(f"{path}[{i}]", v) for i, v in enumerate(value)]
    return value


def _page_method(path: str, value: Mapping[str, Any]) -> Any:
    if value[TAG] != PAGE_METHOD:
        raise TaskError(f"{path}.{TAG}", f"unknown tagged type {str(value[TAG])[:60]!r}")
    check_known_keys(value, _PAGE_METHOD_KEYS, path, "a PageMethod field")
    method, args, kwargs = value.get("method"), value.get("args", []), value.get("kwargs", {})
    if not isinstance(method, str) or not method.isidentifier() or method.startswith("_"):
        raise TaskError(f"{path}.method", f"must name a page method, got {method!r}"[:300])
    if not isinstance(args, list):
        raise TaskError(f"{path}.args", "must be a list")
    if not isinstance(kwargs, Mapping):
        raise TaskError(f"{path}.kwargs", "must be an object")
    if "method" in kwargs:
        raise TaskError(f"{path}.kwargs.method", "would stand in for the method name")
    try:
        from scrapy_playwright.page import PageMethod
    except ImportError:
        raise TaskError(path, "is a PageMethod, and scrapy-playwright is not installed in "
                              "this worker") from None
    return PageMethod(method, *[decode_tagged(f"{path}.args[{i}]", a) for i, a in
                                enumerate(args)],
                      **{k: decode_tagged(f"{path}.kwargs.{k}", v) for k, v in kwargs.items()})


def _is_page_method(value: Any) -> bool:
    cls = type(value)
    return cls.__name__ == PAGE_METHOD and cls.__module__.startswith("scrapy_playwright")


__all__ = ["PAGE_METHOD", "TAG", "decode_tagged", "encode_tagged"]

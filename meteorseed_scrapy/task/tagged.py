"""Meta and cb_kwargs values that are not JSON but are carried all the same, as tagged JSON
objects, and rebuilt by the worker that fetches the task:

* scrapy-playwright's ``PageMethod``: ``{"$meteorseed": "PageMethod", "method": "click",
  "args": [...], "kwargs": {...}}``;
* an item of the project's own (a ``scrapy.Item``, a dataclass, an attrs or pydantic class:
  whatever itemadapter takes, a dict aside, which is JSON already), as a spider passes a
  half-filled item to the callback of the next page: ``{"$meteorseed": "Item", "class":
  "myproject.items.Product", "fields": {...}}``. Its class must be defined at the top level of
  a module of the spider's own top-level package (``myproject``, or the file of ``scrapy
  runspider``) that the worker has imported: a task never makes a worker import a module, nor
  build anything but the project's items;
* a ``Decimal`` (a price-parser amount), a ``datetime``, ``date`` or ``time`` and a ``set``, so
  that the callback gets the value it was given: ``{"$meteorseed": "Decimal", "value":
  "19.90"}``, ``{"$meteorseed": "set", "items": [...]}``.

Any other value that is not JSON is refused at yield time with its path named. The tag key is
reserved: a value that holds it as a plain key is refused too, so that a tagged object always
means one thing.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any

from itemadapter import ItemAdapter

from meteorseed_scrapy.task.json_depth import MAX_DEPTH, TOO_DEEP
from meteorseed_scrapy.task.validation import TaskError, check_known_keys

TAG = "$meteorseed"
PAGE_METHOD = "PageMethod"
ITEM = "Item"
SET = "set"
#: Scalars carried as their text, and how each is read back.
SCALARS: dict[str, Callable[[str], Any]] = {
    "Decimal": Decimal, "datetime": datetime.fromisoformat, "date": date.fromisoformat,
    "time": time.fromisoformat,
}
_PAGE_METHOD_KEYS = frozenset({TAG, "method", "args", "kwargs"})
_ITEM_KEYS = frozenset({TAG, "class", "fields"})


def encode_tagged(path: str, value: Any, home: str | None, depth: int = 0) -> Any:
    """``value`` with every value above replaced by its tagged form; ``home`` is the spider's
    top-level package (None: no item of a class may travel)."""
    if depth > MAX_DEPTH:
        raise TaskError(path, TOO_DEEP)
    if isinstance(value, (str, int, float)) or value is None:  # (bool is an int)
        return value
    if isinstance(value, Mapping) and not _is_item_object(value):
        if TAG in value:
            raise TaskError(f"{path}.{TAG}", "is a reserved key (tagged values)")
        return {k: encode_tagged(f"{path}.{k}", v, home, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_tagged(f"{path}[{i}]", v, home, depth + 1) for i, v in enumerate(value)]
    if isinstance(value, set):
        if not all(isinstance(v, (str, int, float, Decimal, date, time)) or v is None
                   for v in value):  # (a tuple would come back a list, which no set holds)
            raise TaskError(path, "is a set of other than text, numbers and dates")
        return {TAG: SET, "items": [encode_tagged(f"{path}[{i}]", v, home, depth + 1)
                                    for i, v in enumerate(value)]}
    if isinstance(value, Decimal):
        return {TAG: "Decimal", "value": str(value)}
    if isinstance(value, (date, time)):  # (a datetime is a date: it is named first)
        name = ("datetime" if isinstance(value, datetime)
                else "date" if isinstance(value, date) else "time")
        return {TAG: name, "value": value.isoformat()}
    if _is_page_method(value):
        if not isinstance(value.method, str):
            raise TaskError(path, f"PageMethod {value.method!r} can only travel by method "
                                  "name, not as a callable"[:300])
        return {TAG: PAGE_METHOD, "method": value.method,
                "args": [encode_tagged(f"{path}.args", a, home, depth + 1) for a in value.args],
                "kwargs": {k: encode_tagged(f"{path}.kwargs.{k}", v, home, depth + 1)
                           for k, v in value.kwargs.items()}}
    if ItemAdapter.is_item(value):
        return {TAG: ITEM, "class": _item_class_path(path, type(value), home),
                "fields": {k: encode_tagged(f"{path}.{k}", v, home, depth + 1)
                           for k, v in ItemAdapter(value).items()}}
    return value  # (refused by the JSON check after this, naming its path)


def decode_tagged(path: str, value: Any, home: str | None) -> Any:
    """``value`` (JSON, already checked for depth) with its tagged objects rebuilt."""
    if isinstance(value, Mapping):
        if TAG in value:
            return _decode_one(path, value, home)
        return {k: decode_tagged(f"{path}.{k}", v, home) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_tagged(f"{path}[{i}]", v, home) for i, v in enumerate(value)]
    return value


def _decode_one(path: str, value: Mapping[str, Any], home: str | None) -> Any:
    kind = value[TAG]
    if not isinstance(kind, str):
        raise TaskError(f"{path}.{TAG}", f"must name a tagged type, got {str(kind)[:60]!r}")
    if kind == PAGE_METHOD:
        return _page_method(path, value, home)
    if kind == ITEM:
        return _item(path, value, home)
    if kind == SET:
        check_known_keys(value, {TAG, "items"}, path, "a set field")
        items = value.get("items")
        if not isinstance(items, list):
            raise TaskError(f"{path}.items", "must be a list")
        try:
            return {decode_tagged(f"{path}[{i}]", v, home) for i, v in enumerate(items)}
        except TypeError:  # (a list or an object among them)
            raise TaskError(path, "holds a value a set cannot (not hashable)") from None
    if kind in SCALARS:
        check_known_keys(value, {TAG, "value"}, path, f"a {kind} field")
        text = value.get("value")
        try:
            if not isinstance(text, str):
                raise ValueError
            return SCALARS[kind](text)
        except (ValueError, InvalidOperation):
            raise TaskError(f"{path}.value", f"is not a {kind}: {str(text)[:60]!r}") from None
    raise TaskError(f"{path}.{TAG}", f"unknown tagged type {str(kind)[:60]!r}")


def _page_method(path: str, value: Mapping[str, Any], home: str | None) -> Any:
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
    return PageMethod(method, *[decode_tagged(f"{path}.args[{i}]", a, home) for i, a in
                                enumerate(args)],
                      **{k: decode_tagged(f"{path}.kwargs.{k}", v, home)
                         for k, v in kwargs.items()})


def _item(path: str, value: Mapping[str, Any], home: str | None) -> Any:
    check_known_keys(value, _ITEM_KEYS, path, "an item field")
    class_path, fields = value.get("class"), value.get("fields")
    if not isinstance(class_path, str):
        raise TaskError(f"{path}.class", "must be a module.Class path")
    if not isinstance(fields, Mapping):
        raise TaskError(f"{path}.fields", "must be an object")
    cls = _item_class(f"{path}.class", class_path, home)
    values = {k: decode_tagged(f"{path}.{k}", v, home) for k, v in fields.items()}
    try:
        return cls(**values)
    except Exception as exc:  # a field the class does not take; its own checks may raise anything
        raise TaskError(path, f"could not be rebuilt as {class_path}: {exc!r}"[:300]) from None


def _item_class_path(path: str, cls: type, home: str | None) -> str:
    """The path a worker finds ``cls`` again by, or :class:`TaskError` when it would not."""
    module_name, name = cls.__module__, cls.__qualname__
    class_path = f"{module_name}.{name}"
    _check_home(path, class_path, home)
    module = sys.modules.get(module_name)
    # (a class made inside a function: its qualname has a dot, or, made by an older Scrapy's
    # ItemMeta, has none and names no class of the module)
    if "." in name or module is None or inspect.getattr_static(module, name, None) is not cls:
        raise TaskError(path, f"is a {cls.__name__} item, whose class is not found again by "
                              f"its path {class_path[:200]!r}: define it at the top level of "
                              "its module")
    return class_path


def _item_class(path: str, class_path: str, home: str | None) -> type:
    """The item class at ``class_path``, among the modules already imported, of the spider's
    own package ``home``."""
    _check_home(path, class_path, home)
    module_name, _, name = class_path.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        raise TaskError(path, f"needs module {module_name[:200]!r}, which is not imported in "
                              "this worker (import it in the spider's module)")
    cls = inspect.getattr_static(module, name, None)
    if not (isinstance(cls, type) and ItemAdapter.is_item_class(cls)) or issubclass(cls, dict):
        raise TaskError(path, f"{class_path[:200]!r} is not an item class")
    return cls


def _check_home(path: str, class_path: str, home: str | None) -> None:
    if home is None or class_path.split(".")[0] != home:
        raise TaskError(path, f"can travel with a request only when its class is the project's "
                              f"own (a module of {home!r}), not {class_path[:200]!r}")


def _is_item_object(value: Any) -> bool:
    """A mapping that is an item of a class (a ``scrapy.Item``), not a plain dict."""
    return not isinstance(value, dict) and ItemAdapter.is_item(value)


def _is_page_method(value: Any) -> bool:
    cls = type(value)
    return cls.__name__ == PAGE_METHOD and cls.__module__.startswith("scrapy_playwright")


__all__ = ["ITEM", "PAGE_METHOD", "SCALARS", "SET", "TAG", "decode_tagged", "encode_tagged"]

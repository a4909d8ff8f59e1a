"""Checks of the exec task fields that carry the rest of a ``scrapy.Request`` (cookies, flags,
encoding, class...): a stream message may come from anything that can write to Redis, so each
is checked on decoding, and a failure is a :class:`TaskError` naming the field."""

from __future__ import annotations

import base64
import binascii
import codecs
import re
from collections.abc import Mapping
from typing import Any, Protocol

from meteorseed_scrapy.task.validation import TaskError

#: ``module.Class``: dotted identifiers, nothing that could be anything but an attribute path.
_CLASS_PATH = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z")
CLASS_PATH_MAX = 300
#: Keys of a cookie in Request's list-of-dicts form, as Scrapy's CookiesMiddleware reads them.
COOKIE_KEYS = frozenset({"name", "value", "path", "domain", "secure"})
#: Keyword parameters of ``scrapy.Request`` itself (``Request.attributes``): a subclass's own
#: attributes travel in ``request_attrs`` and may not stand in for one of these.
REQUEST_ATTRIBUTES = frozenset({
    "url", "headers", "body", "cookies", "meta", "encoding", "flags", "cb_kwargs", "callback",
    "dont_filter", "errback", "method", "priority"})
FLAGS_MAX = 100


class RequestFields(Protocol):
    """The fields checked here, as an exec task has them (read-only)."""

    @property
    def body(self) -> str: ...
    @property
    def body_b64(self) -> str: ...
    @property
    def cookies(self) -> Any: ...
    @property
    def encoding(self) -> str: ...
    @property
    def flags(self) -> Any: ...
    @property
    def dont_filter(self) -> bool | None: ...
    @property
    def request_class(self) -> str | None: ...
    @property
    def request_attrs(self) -> Any: ...


def check_request_fields(task: RequestFields) -> None:
    if not isinstance(task.body_b64, str):
        raise TaskError("body_b64", "must be a string (base64)")
    if task.body_b64:
        if task.body:
            raise TaskError("body_b64", "must not be given with body (one or the other)")
        try:
            base64.b64decode(task.body_b64, validate=True)
        except (binascii.Error, ValueError):
            raise TaskError("body_b64", "is not valid base64") from None
    check_cookies(task.cookies)
    if not isinstance(task.encoding, str) or not task.encoding:
        raise TaskError("encoding", f"must be a text encoding name, got {task.encoding!r}"[:300])
    try:
        codecs.lookup(task.encoding)
    except LookupError:
        raise TaskError("encoding", f"unknown encoding {task.encoding[:100]!r}") from None
    if not isinstance(task.flags, (list, tuple)) or len(task.flags) > FLAGS_MAX or not all(
            isinstance(flag, str) for flag in task.flags):
        raise TaskError("flags", f"must be a list of at most {FLAGS_MAX} strings")
    if task.dont_filter is not None and not isinstance(task.dont_filter, bool):
        raise TaskError("dont_filter", f"must be true or false, got {task.dont_filter!r}"[:300])
    path = task.request_class
    if path is not None and (not isinstance(path, str) or len(path) > CLASS_PATH_MAX
                             or not _CLASS_PATH.match(path)):
        raise TaskError("request_class", f"must be a module.Class path, got {path!r}"[:300])
    if not isinstance(task.request_attrs, Mapping):
        raise TaskError("request_attrs", "must be an object")
    for key in task.request_attrs:
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("_") \
                or key in REQUEST_ATTRIBUTES:
            raise TaskError(f"request_attrs.{key}"[:200],
                            "must name a public attribute of the Request subclass")
    if task.request_attrs and path is None:
        raise TaskError("request_attrs", "given without request_class")


def check_cookies(cookies: Any) -> None:
    """Request's two forms: ``{name: value}``, or a list of ``{"name", "value", "path",
    "domain", "secure"}`` objects."""
    if isinstance(cookies, Mapping):
        for name, value in cookies.items():
            if not isinstance(name, str) or not _scalar(value):
                raise TaskError(f"cookies.{name}"[:200], "must map a name to a string or number")
        return
    if not isinstance(cookies, (list, tuple)):
        raise TaskError("cookies", "must be an object or a list of objects")
    for i, cookie in enumerate(cookies):
        where = f"cookies[{i}]"
        if not isinstance(cookie, Mapping):
            raise TaskError(where, "must be an object")
        unknown = sorted(str(k) for k in cookie if k not in COOKIE_KEYS)
        if unknown:
            raise TaskError(f"{where}.{unknown[0]}"[:200], "is not a cookie key "
                            f"({', '.join(sorted(COOKIE_KEYS))})")
        for key in ("name", "value"):
            if not _scalar(cookie.get(key)):
                raise TaskError(f"{where}.{key}", "must be a string or number")
        for key in ("path", "domain"):
            if key in cookie and not isinstance(cookie[key], str):
                raise TaskError(f"{where}.{key}", "must be a string")
        if "secure" in cookie and not isinstance(cookie["secure"], bool):
            raise TaskError(f"{where}.secure", "must be true or false")


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


__all__ = ["CLASS_PATH_MAX", "COOKIE_KEYS", "REQUEST_ATTRIBUTES", "check_cookies",
           "check_request_fields"]

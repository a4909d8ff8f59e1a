"""The exec task: one URL to fetch, and its JSON stream message (``v`` and ``t`` fields)."""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field
from functools import cached_property
from typing import Any

from meteorseed_scrapy.task.canonical import canonical_url
from meteorseed_scrapy.task.ids import new_task_id
from meteorseed_scrapy.task.json_depth import (
    MAX_DEPTH,
    TOO_DEEP,
    RepeatedKey,
    refusal,
    unique_object,
)
from meteorseed_scrapy.task.lanes import DEFAULT_LANE
from meteorseed_scrapy.task.validation import (
    TASK_SCHEMES,
    TaskError,
    check_callback,
    check_id,
    check_json_safe,
    check_known_keys,
    check_lane,
    check_request_fields,
    check_spider,
    check_url,
)

MESSAGE_VERSION = "1"
#: The fields of a task stream message: the version and the task JSON, nothing else.
MESSAGE_FIELDS = ("v", "t")
#: Upper bound of one encoded exec task: room for a POST body of about 250 KB of text (190 KB
#: of binary, as base64) while a hostile or runaway message stays cheap to refuse (no HTML ever
#: goes through Redis; a typical task is a few hundred bytes). README "What a spider needs".
MAX_MESSAGE_BYTES = 256 * 1024
#: Integers of a task fit in 64 bits (a BSON document, a Redis score, any JSON reader).
INT_RANGE = (-(2**63), 2**63 - 1)
#: The fields a message may leave out, in the order it writes them (``created_at`` closes it).
OPTIONAL_FIELDS = ("method", "headers", "meta", "cb_kwargs", "body", "callback", "errback",
                   "priority", "retry_count", "lane", "spider", "body_b64", "cookies", "flags",
                   "request_class", "request_attrs", "encoding", "dont_filter")


@dataclass(frozen=True)
class ExecTask:
    """One URL to fetch: the unit that is read, acked, reclaimed and dead-lettered."""

    task_id: str
    seed_id: str
    site_id: str
    url: str
    method: str = "GET"
    headers: Mapping[str, Any] = field(default_factory=dict)
    body: str = ""
    callback: str | None = None
    errback: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    cb_kwargs: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0
    retry_count: int = 0
    created_at: float = 0.0
    lane: str = DEFAULT_LANE  # realtime / scheduled / retry: which task streams it waits in
    # The spider whose workers take it (its own task streams); None: any worker's (the default
    # streams). Children inherit it.
    spider: str | None = None
    # The rest of a scrapy.Request (Request.to_dict's fields); the defaults are what a message
    # written before they existed means.
    body_b64: str = ""  # the body, base64, when it is not UTF-8 text (then ``body`` is empty)
    cookies: Mapping[str, Any] | Sequence[Mapping[str, Any]] = field(default_factory=dict)
    encoding: str = "utf-8"
    flags: Sequence[str] = field(default_factory=list)
    dont_filter: bool | None = None  # None: a seed's task (fetched as a start URL is)
    request_class: str | None = None  # "module.Class" of a Request subclass
    request_attrs: Mapping[str, Any] = field(default_factory=dict)  # the subclass's own

    def __post_init__(self) -> None:
        # First, before any check that prints or encodes a value: nesting, numbers, strings.
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            kind = type(value)
            # Most fields are ASCII text, None, a bool or empty: nothing in them to refuse.
            if not ((kind is str and value.isascii()) or value is None or kind is bool
                    or (kind in _EMPTY_OK and not value)):
                check_json_value(name, value)
        check_id("task_id", self.task_id)
        check_id("seed_id", self.seed_id)
        check_id("site_id", self.site_id)
        check_url(self.url, schemes=TASK_SCHEMES)
        if not isinstance(self.method, str) or not self.method.isalpha():
            raise TaskError("method", f"must be an HTTP method, got {self.method!r}")
        if not isinstance(self.headers, Mapping):
            raise TaskError("headers", "must be an object")
        for key, value in self.headers.items():
            ok = isinstance(value, str) or (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            )
            if not isinstance(key, str) or not ok:
                raise TaskError(f"headers.{key}", "must map a name to a string or list of strings")
        if not isinstance(self.body, str):
            raise TaskError("body", "must be a string")
        check_callback(self.callback, "callback", private=True)
        check_callback(self.errback, "errback", private=True)
        for name in ("meta", "cb_kwargs"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise TaskError(name, "must be an object")
            for key, item in value.items():  # (its keys are strings: check_json_value)
                check_json_safe(f"{name}.{key}", item)
        for name in ("priority", "retry_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TaskError(name, f"must be an integer, got {value!r}")
        if self.retry_count < 0:
            raise TaskError("retry_count", "must not be negative")
        if not isinstance(self.created_at, (int, float)) or isinstance(self.created_at, bool):
            raise TaskError("created_at", "must be a number (epoch seconds)")
        check_lane(self.lane)
        check_spider(self.spider)
        check_request_fields(self)

    @classmethod
    def create(cls, *, seed_id: str, site_id: str, url: str, **kwargs: Any) -> ExecTask:
        kwargs.setdefault("created_at", round(time.time(), 3))
        return cls(task_id=new_task_id(), seed_id=seed_id, site_id=site_id, url=url, **kwargs)

    @property
    def body_bytes(self) -> bytes:
        """The request body as sent."""
        if self.body_b64:
            return base64.b64decode(self.body_b64)
        return self.body.encode("utf-8")

    @cached_property
    def canonical_url(self) -> str:
        """The URL in its dedup form (computed once: a decoded message is checked with it, and
        the worker keys the task's history record by it)."""
        return canonical_url(self.url)

    def to_dict(self) -> dict[str, Any]:
        """The task as JSON values. A field at its default, or empty (``cookies`` may be
        ``[]`` or ``{}``), is left out: messages stay small."""
        out: dict[str, Any] = {"task_id": self.task_id, "seed_id": self.seed_id,
                               "site_id": self.site_id, "url": self.url}
        for name, default in _DEFAULTS.items():  # (in OPTIONAL_FIELDS' order)
            value = getattr(self, name)
            if value != default and (value or value is False):
                out[name] = list(value) if isinstance(value, (list, tuple)) else (
                    dict(value) if isinstance(value, Mapping) else value)
        out["created_at"] = self.created_at
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ExecTask:
        if not isinstance(data, dict):
            raise TaskError("task", "must be a JSON object")
        missing = [name for name in ("task_id", "seed_id", "site_id", "url") if name not in data]
        if missing:
            raise TaskError(missing[0], "is missing")
        check_known_keys(data, cls.__dataclass_fields__, "", "an exec task field")
        return cls(**data)

    def to_message(self) -> dict[str, str]:
        """Stream fields for XADD; raises :class:`TaskError` when the task is too large."""
        # A task made by SeedTask.exec_task_factory carries its JSON, built once (the same text).
        encoded = self.__dict__.get("_json")
        if encoded is None:
            encoded = json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)
        # (non-ASCII: encode, which also fails on a lone surrogate, as it always did)
        size = len(encoded) if encoded.isascii() else len(encoded.encode("utf-8"))
        if size > MAX_MESSAGE_BYTES:
            raise TaskError("task", f"encodes to more than {MAX_MESSAGE_BYTES} bytes")
        return {"v": MESSAGE_VERSION, "t": encoded}

    @classmethod
    def from_message(cls, fields: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> ExecTask:
        """Decode stream fields (a mapping, or the ``(name, value)`` pairs as stored; bytes or
        str). Whatever the content, the only exception is a :class:`TaskError` naming the
        problem: the message is exactly ``v`` and ``t``, strict UTF-8 (a byte that is not
        UTF-8 is refused, never replaced), ``t`` at most :data:`MAX_MESSAGE_BYTES` of JSON
        that makes a valid task (see :func:`check_json_value`) whose URL canonicalises."""
        message = _message(fields)
        version = message.get("v")
        text = None if version is None else _strict_text("v", version)
        if text != MESSAGE_VERSION:
            raise TaskError("v", f"unsupported message version {_shown(text)}")
        check_known_keys(message, MESSAGE_FIELDS, "", "a field of a task message")
        raw = message.get("t")
        if raw is None:
            raise TaskError("t", "is missing")
        size = len(raw if isinstance(raw, bytes) else str(raw).encode("utf-8", "surrogatepass"))
        if size > MAX_MESSAGE_BYTES:
            raise TaskError("task", f"is larger than {MAX_MESSAGE_BYTES} bytes ({size})")
        body = _strict_text("t", raw)
        try:
            # NaN and Infinity parse, and are then refused naming their field (check_json_value).
            data = json.loads(body, object_pairs_hook=unique_object)
        except (RecursionError, ValueError, RepeatedKey) as exc:
            # Refused as a Python whose json parses it refuses it (how deep json.loads goes
            # depends on the Python), naming the path from the task's fields.
            refused = refusal("", body, exc, fields=True, whole="t")
            if refused is None:
                raise TaskError("t", f"is not valid JSON ({exc})"[:300]) from None
            if refused.field.startswith("["):
                raise TaskError("task", "must be a JSON object") from None
            raise refused from None
        if type(data) is dict and body.count("[") + body.count("{") > MAX_DEPTH:
            # Nesting first, as where json.loads gives up: else a deep message that also
            # lacks a field names the field on one Python and the nesting on another.
            for name, value in data.items():
                check_json_value(name, value)
        task = cls.from_dict(data)
        try:
            task.canonical_url  # noqa: B018 (kept for the fingerprint)
        except ValueError as exc:
            raise TaskError("url", f"cannot be canonicalised ({exc}): {task.url[:200]!r}") from None
        return task


def _default(spec: Field[Any]) -> Any:
    return spec.default if spec.default_factory is MISSING else spec.default_factory()


_DEFAULTS = {name: _default(ExecTask.__dataclass_fields__[name]) for name in OPTIONAL_FIELDS}


def _message(fields: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> dict[str, Any]:
    """The fields by name (values as given); a name that is not UTF-8 or appears twice is
    refused: which of two values counts would depend on the reader."""
    pairs = fields.items() if isinstance(fields, Mapping) else fields
    out: dict[str, Any] = {}
    for key, value in pairs:
        name = _strict_text(f"field name {_shown(key)}", key)
        if name in out:
            raise TaskError(name, "appears more than once in the message")
        out[name] = value
    return out


def _strict_text(name: str, value: Any) -> str:
    """``value`` as text; bytes must be UTF-8 and text must encode as UTF-8 (no lone
    surrogate): anything else is refused, never replaced."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TaskError(name, f"is not valid UTF-8 (byte {value[exc.start]:#04x} at offset "
                                  f"{exc.start})") from None
    text = value if isinstance(value, str) else str(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TaskError(name, f"is not valid UTF-8 (lone surrogate at offset {exc.start})"
                            ) from None
    return text


#: Containers :func:`check_json_value` finds nothing to refuse in when they are empty.
_EMPTY_OK = (dict, list, tuple)


def _shown(value: Any) -> str:
    return repr(value)[:60]


def check_json_value(name: str, value: Any) -> None:
    """Refuse, naming the path, nesting deeper than :data:`MAX_DEPTH`, a non-string object key,
    a number that is not finite or an integer out of :data:`INT_RANGE`, and a string that is
    not UTF-8 (a lone surrogate). Iterative, so that no input can exhaust the stack here."""
    stack: list[tuple[str, Any, int]] = [(name, value, 0)]
    low, high = INT_RANGE
    while stack:
        path, item, depth = stack.pop()
        if isinstance(item, str):
            _strict_text(path, item)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not low <= item <= high:
                raise TaskError(path, "is an integer out of the 64-bit range")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise TaskError(path, f"is not a finite number ({item!r})")
        elif isinstance(item, (Mapping, list, tuple)):
            if depth >= MAX_DEPTH:
                raise TaskError(path, TOO_DEEP)
            if isinstance(item, Mapping):
                for key, sub in item.items():
                    if not isinstance(key, str):
                        raise TaskError(f"{path}.{_shown(key)}", "keys must be strings")
                    _strict_text(f"{path}.{_shown(key)}", key)
                    key_path = f"{path}.{key[:100]}"
                    stack.append((key_path, sub, depth + 1))
            else:
                stack.extend((f"{path}[{i}]", sub, depth + 1) for i, sub in enumerate(item))


__all__ = ["INT_RANGE", "MAX_DEPTH", "MAX_MESSAGE_BYTES", "MESSAGE_FIELDS", "MESSAGE_VERSION",
           "ExecTask", "check_json_value"]

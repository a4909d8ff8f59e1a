"""Seed tasks and exec tasks: small validated value objects and their JSON message format.

An exec task travels through a Redis Stream as two fields: ``v`` (the format version) and
``t`` (the task as compact JSON). Never pickle: a message must be readable by any worker,
any version, any language, and must not be able to run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from w3lib.url import canonicalize_url

from meteorseed_scrapy.keys import DEFAULT_LANE, LANES

MESSAGE_VERSION = "1"
#: Upper bound of one encoded exec task; messages stay small (no HTML ever goes through Redis).
MAX_MESSAGE_BYTES = 64 * 1024
TASK_TYPES = frozenset({"url_list", "url_template", "sitemap", "keywords"})
_ID_MAX = 200
_SPACE = re.compile(r"\s")  # the characters str.isspace() accepts, found in C, not in Python


class TaskError(ValueError):
    """A task or seed failed validation; ``field`` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _check_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TaskError(name, f"must be a non-empty string, got {value!r}"[:300])
    if len(value) > _ID_MAX or _SPACE.search(value):
        raise TaskError(name, f"must be at most {_ID_MAX} characters without spaces")
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


def _check_lane(value: Any) -> None:
    if value not in LANES:
        raise TaskError("lane", f"must be one of {', '.join(LANES)}, got {value!r}"[:300])


def _check_json_safe(name: str, value: Any) -> None:
    try:
        # ensure_ascii=False + encode: a lone surrogate fails here, not later in to_message().
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TaskError(name, f"must be JSON-serialisable ({exc})") from None


# URLs that w3lib's canonicalize_url returns unchanged, recognised without parsing them: a
# lowercase http(s) scheme; a lowercase ASCII host of LDH labels (no "--", so no punycode; the
# last label starts with a letter, so no IPv4) without port or userinfo; a path of unreserved
# characters (dot segments are checked apart); an optional query of key=value pairs of
# unreserved characters, already in sorted order; no fragment. tests/test_tasks.py compares
# this with w3lib over many varied URLs.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_UNRESERVED = r"[A-Za-z0-9._~-]"
_CANONICAL_AS_IS = re.compile(
    rf"https?://((?:{_LABEL}\.)*[a-z](?:[a-z0-9-]{{0,61}}[a-z0-9])?)"
    rf"(/[A-Za-z0-9._~/-]*)"
    rf"(?:\?({_UNRESERVED}+={_UNRESERVED}*(?:&{_UNRESERVED}+={_UNRESERVED}*)*))?"
)
_DOT_SEGMENT = re.compile(r"/\.\.?(?:/|$)")


def _is_canonical(url: str) -> bool:
    match = _CANONICAL_AS_IS.fullmatch(url)
    if match is None:
        return False
    host, path, query = match.groups()
    if len(host) > 253 or "--" in host or ("/." in path and _DOT_SEGMENT.search(path)):
        return False
    if query and "&" in query:
        pairs = [tuple(pair.split("=", 1)) for pair in query.split("&")]
        if pairs != sorted(pairs):
            return False
    return True


def canonical_url(url: str) -> str:
    """The URL form used for dedup and for default document keys (w3lib's canonicalize_url;
    a URL already in that form is recognised and returned without parsing it)."""
    if _is_canonical(url):
        return url
    return canonicalize_url(url, keep_fragments=False)


def url_fingerprint(url: str) -> str:
    """Hex SHA-256 of the canonical URL (the default ``unique_key`` of stored documents)."""
    return hashlib.sha256(canonical_url(url).encode("utf-8")).hexdigest()


def new_task_id() -> str:
    return uuid.uuid4().hex


class _RandomPool(threading.local):
    """os.urandom bytes fetched 8 KiB at a time, per thread (one system call per 512 ids
    instead of one per id); emptied in a forked child so parent and child never share ids."""

    def __init__(self) -> None:
        self.data = b""
        self.at = 0


_POOL = _RandomPool()
_POOL_BYTES = 16 * 512


def _reset_pool() -> None:
    global _POOL
    _POOL = _RandomPool()


os.register_at_fork(after_in_child=_reset_pool)


def _fast_task_id() -> str:
    """What :func:`new_task_id` returns (a random version-4 UUID as 32 hex digits), without
    building a UUID object."""
    pool = _POOL
    at = pool.at
    if at >= len(pool.data):
        pool.data, at = os.urandom(_POOL_BYTES), 0
    raw = bytearray(pool.data[at:at + 16])
    pool.at = at + 16
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


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

    def __post_init__(self) -> None:
        _check_id("task_id", self.task_id)
        _check_id("seed_id", self.seed_id)
        _check_id("site_id", self.site_id)
        check_url(self.url)
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
        for name in ("callback", "errback"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.isidentifier()):
                raise TaskError(name, f"must be a method name, got {value!r}")
        for name in ("meta", "cb_kwargs"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise TaskError(name, "must be an object")
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TaskError(f"{name}.{key!r}", "keys must be strings")
                _check_json_safe(f"{name}.{key}", item)
        for name in ("priority", "retry_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TaskError(name, f"must be an integer, got {value!r}")
        if self.retry_count < 0:
            raise TaskError("retry_count", "must not be negative")
        if not isinstance(self.created_at, (int, float)) or isinstance(self.created_at, bool):
            raise TaskError("created_at", "must be a number (epoch seconds)")
        _check_lane(self.lane)

    @classmethod
    def create(cls, *, seed_id: str, site_id: str, url: str, **kwargs: Any) -> ExecTask:
        kwargs.setdefault("created_at", round(time.time(), 3))
        return cls(task_id=new_task_id(), seed_id=seed_id, site_id=site_id, url=url, **kwargs)

    @property
    def canonical_url(self) -> str:
        return canonical_url(self.url)

    def to_dict(self) -> dict[str, Any]:
        # Defaults are left out: messages stay small.
        out: dict[str, Any] = {
            "task_id": self.task_id,
            "seed_id": self.seed_id,
            "site_id": self.site_id,
            "url": self.url,
        }
        if self.method != "GET":
            out["method"] = self.method
        for name in ("headers", "meta", "cb_kwargs"):
            if getattr(self, name):
                out[name] = dict(getattr(self, name))
        if self.body:
            out["body"] = self.body
        if self.callback:
            out["callback"] = self.callback
        if self.errback:
            out["errback"] = self.errback
        if self.priority:
            out["priority"] = self.priority
        if self.retry_count:
            out["retry_count"] = self.retry_count
        if self.lane != DEFAULT_LANE:
            out["lane"] = self.lane
        out["created_at"] = self.created_at
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ExecTask:
        if not isinstance(data, dict):
            raise TaskError("task", "must be a JSON object")
        missing = [name for name in ("task_id", "seed_id", "site_id", "url") if name not in data]
        if missing:
            raise TaskError(missing[0], "is missing")
        known = cls.__dataclass_fields__
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise TaskError(unknown[0], "is not an exec task field")
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
    def from_message(cls, fields: Mapping[Any, Any]) -> ExecTask:
        """Decode stream fields (bytes or str); raises :class:`TaskError` naming the problem."""
        decoded = {_text(k): _text(v) for k, v in fields.items()}
        version = decoded.get("v")
        if version != MESSAGE_VERSION:
            raise TaskError("v", f"unsupported message version {version!r}")
        raw = decoded.get("t")
        if raw is None:
            raise TaskError("t", "is missing")
        if len(raw.encode("utf-8")) > MAX_MESSAGE_BYTES:
            raise TaskError("task", f"is larger than {MAX_MESSAGE_BYTES} bytes")
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise TaskError("t", f"is not valid JSON ({exc})") from None
        return cls.from_dict(data)


_json_str: Callable[[str], str] = json.encoder.encode_basestring


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@dataclass(frozen=True)
class SeedTask:
    """Where data comes from and how often; ``seed-expand`` turns it into exec tasks."""

    seed_id: str
    site_id: str
    task_type: str
    payload: Mapping[str, Any]
    priority: int = 0
    schedule: Any = None
    parse_rule: str | None = None
    callback: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    lane: str = DEFAULT_LANE

    def __post_init__(self) -> None:
        _check_id("seed_id", self.seed_id)
        _check_id("site_id", self.site_id)
        if self.task_type not in TASK_TYPES:
            raise TaskError(
                "task_type", f"must be one of {sorted(TASK_TYPES)}, got {self.task_type!r}"
            )
        if not isinstance(self.payload, Mapping):
            raise TaskError("payload", "must be an object")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise TaskError("priority", f"must be an integer, got {self.priority!r}")
        if self.callback is not None and (
            not isinstance(self.callback, str) or not self.callback.isidentifier()
        ):
            raise TaskError("callback", f"must be a method name, got {self.callback!r}")
        if self.parse_rule is not None and not isinstance(self.parse_rule, str):
            raise TaskError("parse_rule", "must be a string")
        if not isinstance(self.meta, Mapping):
            raise TaskError("meta", "must be an object")
        _check_json_safe("meta", dict(self.meta))
        _check_lane(self.lane)

    @classmethod
    def from_dict(cls, data: Any) -> SeedTask:
        if not isinstance(data, dict):
            raise TaskError("seed", "must be a JSON object")
        for name in ("seed_id", "site_id", "task_type", "payload"):
            if name not in data:
                raise TaskError(name, "is missing")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise TaskError(unknown[0], "is not a seed field")
        return cls(**data)

    def exec_task_factory(self) -> Callable[[Any], ExecTask] | None:
        """A faster :meth:`exec_task` for many URLs of this seed, or None when the seed-level
        fields of its exec tasks do not validate (then use :meth:`exec_task`, whose errors name
        the problem).

        Everything but the URL, task id and creation time is validated once, here; per URL only
        the URL is checked (raising the same :class:`TaskError` as :meth:`exec_task`). Each
        task's message JSON is built from pieces encoded once and is identical to what
        :meth:`ExecTask.to_message` would encode.
        """
        try:
            template = self.exec_task("http://template.invalid/")
        except ValueError:
            return None
        fields = template.__dict__
        rest = {k: v for k, v in template.to_dict().items()
                if k not in ("task_id", "seed_id", "site_id", "url", "created_at")}
        middle = json.dumps(rest, separators=(",", ":"), ensure_ascii=False)[1:-1]
        head = (
            f',"seed_id":{_json_str(self.seed_id)},"site_id":{_json_str(self.site_id)},"url":'
        )
        tail = f",{middle}" if middle else ""
        new_object = object.__new__
        now = time.time

        def make(url: Any) -> ExecTask:
            check_url(url)
            task_id = _fast_task_id()
            created_at = round(now(), 3)
            task = new_object(ExecTask)
            values = task.__dict__
            values.update(fields)
            values["task_id"] = task_id
            values["url"] = url
            values["headers"] = dict(fields["headers"])
            values["meta"] = dict(fields["meta"])
            values["cb_kwargs"] = dict(fields["cb_kwargs"])
            values["created_at"] = created_at
            values["_json"] = (
                f'{{"task_id":"{task_id}"{head}{_json_str(url)}{tail},'
                f'"created_at":{created_at!r}}}'
            )
            return task

        return make

    def exec_task(self, url: str, **extra: Any) -> ExecTask:
        """An exec task for one URL of this seed (``url`` must already be validated)."""
        meta = dict(self.meta)
        if self.parse_rule:
            meta.setdefault("parse_rule", self.parse_rule)
        return ExecTask.create(
            seed_id=self.seed_id,
            site_id=self.site_id,
            url=url,
            callback=self.callback,
            priority=self.priority,
            meta=meta,
            lane=self.lane,
            **extra,
        )

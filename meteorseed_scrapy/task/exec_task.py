"""The exec task: one URL to fetch, and its JSON stream message (see :mod:`.tasks`)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meteorseed_scrapy.task.canonical import canonical_url
from meteorseed_scrapy.task.ids import new_task_id
from meteorseed_scrapy.task.lanes import DEFAULT_LANE
from meteorseed_scrapy.task.validation import (
    TaskError,
    check_id,
    check_json_safe,
    check_lane,
    check_url,
)

MESSAGE_VERSION = "1"
#: Upper bound of one encoded exec task; messages stay small (no HTML ever goes through Redis).
MAX_MESSAGE_BYTES = 64 * 1024


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
        check_id("task_id", self.task_id)
        check_id("seed_id", self.seed_id)
        check_id("site_id", self.site_id)
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


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


__all__ = ["MAX_MESSAGE_BYTES", "MESSAGE_VERSION", "ExecTask"]

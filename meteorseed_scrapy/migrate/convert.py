"""scrapy-redis entries (request dicts, start-URL payloads) to exec tasks.

A queued request is the dict of ``Request.to_dict()``; a start URL is a plain URL or the JSON
object scrapy-redis 0.9 turns into ``FormRequest(url, method=..., formdata=<other keys>,
meta=...)``. Start URLs are built with that same FormRequest call, so a migrated task carries
the exact URL, body and headers scrapy-redis would have sent.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from scrapy import FormRequest

from meteorseed_scrapy.migrate.unpickle import (
    MAX_PAYLOAD_BYTES,
    RejectedPayload,
    check_shape,
    json_rejection,
)
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.json_depth import loads_bounded
from meteorseed_scrapy.task.validation import REQUEST_ATTRIBUTES, TaskError
from meteorseed_scrapy.worker.requests import PER_DOWNLOAD_META, task_to_request

#: Request classes whose whole state is in url/method/headers/body: safe to send as a task.
PLAIN_CLASSES = frozenset({
    "scrapy.http.request.Request", "scrapy.http.request.form.FormRequest",
    "scrapy.http.request.json_request.JsonRequest", "scrapy.http.request.rpc.XmlRpcRequest",
    "scrapy.Request", "scrapy.FormRequest", "scrapy.http.Request", "scrapy.http.FormRequest",
    "scrapy.http.JsonRequest",
})


@dataclass(frozen=True)
class Origin:
    """Where migrated tasks say they come from."""

    site_id: str
    seed_id: str
    spider: str | None = None  # the spider whose queue they come from: its workers take them


@dataclass(frozen=True)
class Converted:
    task: ExecTask
    #: meta keys left out because their values are not JSON (reported, not fatal).
    dropped_meta: tuple[str, ...] = ()


def _text(value: Any, field: str, encoding: str = "latin-1") -> str:
    if isinstance(value, bytes):
        try:
            return value.decode(encoding)
        except UnicodeDecodeError:
            raise RejectedPayload(f"{field}: is not {encoding} text") from None
    if isinstance(value, str):
        return value
    raise RejectedPayload(f"{field}: expected text, got {type(value).__name__}")


def _method(value: Any) -> str:
    method = _text(value, "method")
    if not (method.isascii() and method.isalpha()):
        # str.isalpha() accepts any script (and "ﬀ".upper() is "FF"): a method is ASCII.
        raise RejectedPayload(f"method: not an HTTP method: {method[:20]!r}")
    return method.upper()


def _headers(raw: Any) -> dict[str, list[str]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise RejectedPayload("headers: expected a mapping")
    out: dict[str, list[str]] = {}
    for key, values in raw.items():
        name = _text(key, "headers")
        items = values if isinstance(values, (list, tuple)) else [values]
        out[name] = [_text(v, f"headers.{name}") for v in items]
    return out


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError):
        return False
    return True


def request_dict_to_task(data: Mapping[str, Any], origin: Origin) -> Converted:
    """An exec task from a ``Request.to_dict()``, carrying every field of it (a Scrapy request
    subclass's own attributes too); raises :class:`RejectedPayload` when the request cannot
    be carried by a JSON task without losing what it means. (Whether it fits in a message is
    the writer's to say: :func:`~meteorseed_scrapy.migrate.scrapy_redis.migrate` encodes each
    entry on its own.)"""
    cls = data.get("_class")
    if cls is not None and (not isinstance(cls, str) or cls not in PLAIN_CLASSES):
        raise RejectedPayload(f"_class: {cls!r} is not a plain Scrapy request class")
    attrs = {k: v for k, v in data.items() if k not in REQUEST_ATTRIBUTES and k != "_class"}
    if attrs and cls is None:
        # A plain Request has no other attribute: an unknown one would be dropped silently.
        raise RejectedPayload(f"{sorted(map(str, attrs))[0][:100]}: is not a field of a "
                              "request dict")
    cb_kwargs = data.get("cb_kwargs") or {}
    if not isinstance(cb_kwargs, Mapping) or not _json_safe(dict(cb_kwargs)):
        # The callback needs these arguments: a task without them would fail in the spider.
        raise RejectedPayload("cb_kwargs: not JSON-serialisable")
    meta_in = data.get("meta") or {}
    if not isinstance(meta_in, Mapping):
        raise RejectedPayload("meta: expected a mapping")
    meta: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in meta_in.items():
        if not isinstance(key, str) or key in PER_DOWNLOAD_META:
            continue
        if _json_safe(value):
            meta[key] = value
        else:
            dropped.append(key)
    body, body_b64 = _body(data.get("body") or b"")
    flags = data.get("flags") or []
    try:
        task = ExecTask.create(
            seed_id=origin.seed_id,
            site_id=origin.site_id,
            url=_text(data.get("url"), "url", "utf-8"),
            method=_method(data.get("method") or "GET"),
            headers=_headers(data.get("headers")),
            body=body,
            body_b64=body_b64,
            cookies=data.get("cookies") or {},
            encoding=data.get("encoding") or "utf-8",
            flags=list(flags) if isinstance(flags, (list, tuple)) else flags,
            dont_filter=data.get("dont_filter", False),
            callback=data.get("callback"),
            errback=data.get("errback"),
            meta=meta,
            cb_kwargs=dict(cb_kwargs),
            priority=data.get("priority", 0),
            request_class=cls,
            request_attrs=attrs,
            spider=origin.spider,
        )
        if cls is not None:  # a subclass that cannot be rebuilt is refused now, not dead later
            task_to_request(replace(task, callback=None, errback=None), None)
    except TaskError as exc:
        raise RejectedPayload(str(exc)) from None
    return Converted(task, tuple(dropped))


def _body(value: Any) -> tuple[str, str]:
    """``(body, body_b64)`` of a task: UTF-8 text as it is, other bytes as base64."""
    if isinstance(value, str):
        return value, ""
    if not isinstance(value, bytes):
        raise RejectedPayload(f"body: expected bytes, got {type(value).__name__}")
    try:
        return value.decode("utf-8"), ""
    except UnicodeDecodeError:
        return "", base64.b64encode(value).decode("ascii")


def start_url_to_task(payload: bytes | str, origin: Origin, priority: int = 0,
                      encoding: str = "utf-8") -> Converted:
    """An exec task from one start-URL entry, built as scrapy-redis's ``RedisSpider`` would."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise RejectedPayload(f"entry is larger than {MAX_PAYLOAD_BYTES} bytes")
    text = _text(payload, "start URL", encoding).strip()
    try:
        if text.startswith("{") and text.endswith("}"):
            try:
                params = loads_bounded("", text)
            except TaskError as exc:  # the same on every Python
                raise RejectedPayload(json_rejection(exc)) from None
            check_shape(params)
            if not isinstance(params.get("url"), str):
                raise RejectedPayload("start URL JSON has no url")
            url = params.pop("url")
            method = _method(params.pop("method", "GET"))
            meta = params.pop("meta", None) or {}
            if not isinstance(meta, dict):
                raise RejectedPayload("start URL JSON: meta is not an object")
            request = FormRequest(url, dont_filter=True, method=method, formdata=params,
                                  meta=meta)
        else:
            request = FormRequest(text, dont_filter=True)
    except RejectedPayload:
        raise
    except (ValueError, TypeError, AttributeError) as exc:
        raise RejectedPayload(f"start URL: {exc}"[:300]) from None
    data = request.to_dict()
    data.pop("_class", None)
    data["priority"] = priority
    return request_dict_to_task(data, origin)

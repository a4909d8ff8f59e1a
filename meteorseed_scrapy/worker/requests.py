"""ExecTask <-> scrapy.Request, without pickle.

Requests that a callback yields become tasks: their callback and errback must be spider methods
(stored by name) and their ``meta`` and ``cb_kwargs`` JSON-safe; otherwise a
:class:`~meteorseed_scrapy.task.TaskError` names the field.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from scrapy import Request, Spider

from meteorseed_scrapy.task.context import LEASE_META_KEY, TASK_META_KEY
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.lanes import DEFAULT_LANE
from meteorseed_scrapy.task.validation import TaskError, check_callback, check_json_safe

#: Per-download meta keys that Scrapy's own middlewares set; a new task starts without them.
_DOWNLOAD_META = frozenset({
    TASK_META_KEY, "download_latency", "download_slot", "retry_times", "redirect_times",
    "redirect_ttl", "redirect_urls", "redirect_reasons", "_scheme_proxy", "depth_stats",
    "robotstxt_checked", "cached_response", LEASE_META_KEY,
})
START_SEED_ID = "start"


def status_allowed(status: int, request: Request, spider: Spider | None, settings: Any) -> bool:
    """Whether the spider asked to handle ``status`` itself (as HttpErrorMiddleware decides)."""
    meta = request.meta
    if meta.get("handle_httpstatus_all") or settings.getbool("HTTPERROR_ALLOW_ALL"):
        return True
    allowed = meta.get("handle_httpstatus_list")
    if allowed is None:
        allowed = getattr(spider, "handle_httpstatus_list", None) or []
        allowed = [*allowed, *settings.getlist("HTTPERROR_ALLOWED_CODES")]
    return status in {int(s) for s in allowed}


def _method(spider: Spider | None, name: str | None, field: str) -> Any:
    """The spider's bound method ``name``, checked again here: a stream message may come from
    anything that can write to Redis, not only from a validated task."""
    if name is None:
        return None
    check_callback(name, field)
    # A function defined on the spider's class (not a property, a classmethod, a callable
    # attribute, or something an instance attribute shadows), bound to this spider.
    defined = inspect.getattr_static(type(spider), name, None)
    method = getattr(spider, name, None)
    if not isinstance(defined, types.FunctionType) or getattr(method, "__self__", None) \
            is not spider:
        raise TaskError(field, f"spider {getattr(spider, 'name', None)!r} has no method {name!r}")
    return method


def task_to_request(task: ExecTask, spider: Spider | None) -> Request:
    """The Request for a task; the task itself travels in ``meta["meteorseed_task"]``."""
    meta = dict(task.meta)
    meta[TASK_META_KEY] = task
    return Request(
        task.url,
        method=task.method,
        headers=dict(task.headers) or None,
        body=task.body.encode("utf-8") if task.body else None,
        callback=_method(spider, task.callback, "callback"),
        errback=_method(spider, task.errback, "errback"),
        cb_kwargs=dict(task.cb_kwargs),
        meta=meta,
        priority=task.priority,
        # Dedup happened when the task entered the stream; a task is fetched when delivered.
        dont_filter=True,
    )


def _name_of(spider: Spider | None, func: Any, field: str) -> str | None:
    if func is None:
        return None
    if isinstance(func, str):
        _method(spider, func, field)
        return func
    name = getattr(func, "__name__", None)
    if getattr(func, "__self__", None) is spider and name and getattr(spider, name, None) == func:
        return name
    raise TaskError(field, f"must be a method of the spider (stored by name), got {func!r}")


def _headers(request: Request) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, values in request.headers.items():
        name = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        out[name] = [v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in values]
    return out


def _check_retry_meta(meta: dict[str, Any]) -> None:
    """Scrapy's retry keys, as the BackoffMiddleware reads them: refused here, with the key
    named, rather than failing every download of the task later."""
    limit = meta.get("max_retry_times")
    if limit is not None and (type(limit) is not int or not 0 <= limit <= 1000):
        raise TaskError("meta.max_retry_times",
                        f"must be a whole number from 0 to 1000, got {limit!r}"[:300])
    if meta.get("dont_retry") is not None and type(meta["dont_retry"]) is not bool:
        raise TaskError("meta.dont_retry", f"must be true or false, got {meta['dont_retry']!r}"
                        [:300])


def request_to_task(request: Request, spider: Spider | None, parent: ExecTask | None) -> ExecTask:
    """A new exec task for a request yielded by ``parent``'s callback (or by ``start()``)."""
    meta = {k: v for k, v in request.meta.items() if k not in _DOWNLOAD_META}
    for name, mapping in (("meta", meta), ("cb_kwargs", request.cb_kwargs)):
        for key, value in mapping.items():
            check_json_safe(f"{name}.{key}", value)
    _check_retry_meta(meta)
    try:
        body = request.body.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskError("body", "must be UTF-8 text") from None
    if parent is not None:
        seed_id, site_id = parent.seed_id, parent.site_id
    else:
        seed_id = START_SEED_ID
        site_id = str(meta.get("site_id") or getattr(spider, "site_id", None)
                      or getattr(spider, "name", None) or "default")
    return ExecTask.create(
        seed_id=seed_id,
        site_id=site_id,
        url=request.url,
        method=request.method,
        headers=_headers(request),
        body=body,
        callback=_name_of(spider, request.callback, "callback"),
        errback=_name_of(spider, request.errback, "errback"),
        meta=meta,
        cb_kwargs=dict(request.cb_kwargs),
        priority=request.priority,
        # Children stay in their parent's lane (a realtime page's links are realtime too).
        lane=parent.lane if parent is not None else DEFAULT_LANE,
    )

"""ExecTask <-> scrapy.Request, without pickle.

Requests that a callback yields become tasks carrying every field of ``Request.to_dict()``:
their callback and errback must be methods of the spider's class (stored by name), their
``meta`` and ``cb_kwargs`` JSON-safe (the project's items, ``Decimal``, dates, sets and
scrapy-playwright's ``PageMethod`` travel tagged, see :mod:`meteorseed_scrapy.task.tagged`), a
body that is not UTF-8 goes as base64, and a Request subclass is rebuilt from its path and
attributes; otherwise a :class:`~meteorseed_scrapy.task.validation.TaskError` names the field.
"""

from __future__ import annotations

import base64
import inspect
import sys
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider

from meteorseed_scrapy.scrapy_internals import is_default_callback
from meteorseed_scrapy.task.context import LEASE_META_KEY, TASK_META_KEY
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.lanes import DEFAULT_LANE
from meteorseed_scrapy.task.tagged import decode_tagged, encode_tagged
from meteorseed_scrapy.task.validation import (
    REQUEST_ATTRIBUTES,
    TaskError,
    check_callback,
    check_json_safe,
    check_spider,
)

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: Per-download meta keys that Scrapy's own middlewares set; a new task starts without them.
#: Not ``download_slot``: a spider sets it to choose a request's slot (``DOWNLOAD_SLOTS``), and
#: Scrapy keeps the one a request carries; a task without one is put in its site's slot
#: (``SiteSlotMiddleware``), which a child copying its parent's meta shares anyway.
PER_DOWNLOAD_META = frozenset({
    TASK_META_KEY, "download_latency", "retry_times", "redirect_times",
    "redirect_ttl", "redirect_urls", "redirect_reasons", "_scheme_proxy", "depth_stats",
    "robotstxt_checked", "cached_response", LEASE_META_KEY,
})
START_SEED_ID = "start"


def status_allowed(status: int, request: Request, spider: Spider | None,
                   settings: BaseSettings) -> bool:
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
    check_callback(name, field, private=True)
    # A function defined on the spider's class (not a property, a classmethod, a callable
    # attribute, or something an instance attribute shadows), bound to this spider.
    defined = inspect.getattr_static(type(spider), name, None)
    method = getattr(spider, name, None)
    if not isinstance(defined, types.FunctionType) or getattr(method, "__self__", None) \
            is not spider:
        raise TaskError(field, f"spider {getattr(spider, 'name', None)!r} has no method {name!r}")
    return method


def task_to_request(task: ExecTask, spider: Spider | None) -> Request:
    """The Request for a task, of the class it was yielded as; the task itself travels in
    ``meta["meteorseed_task"]``."""
    home = _home(spider)
    meta = {key: decode_tagged(f"meta.{key}", value, home) for key, value in task.meta.items()}
    meta[TASK_META_KEY] = task
    cls = _request_class(task.request_class)
    cookies = task.cookies
    kwargs = dict(
        method=task.method,
        headers=_header_bytes(task.headers) or None,
        body=task.body_bytes or None,
        cookies=dict(cookies) if isinstance(cookies, Mapping) else [dict(c) for c in cookies],
        callback=_method(spider, task.callback, "callback"),
        errback=_method(spider, task.errback, "errback"),
        cb_kwargs={key: decode_tagged(f"cb_kwargs.{key}", value, home)
                   for key, value in task.cb_kwargs.items()},
        meta=meta,
        encoding=task.encoding,
        priority=task.priority,
        # A seed's task is fetched as a start URL is (dedup happened when it entered the stream).
        dont_filter=True if task.dont_filter is None else task.dont_filter,
        flags=list(task.flags),
        **task.request_attrs,
    )
    if cls is Request:
        return Request(task.url, **kwargs)
    try:
        return cls(task.url, **kwargs)
    except Exception as exc:  # a user subclass's constructor may raise anything
        raise TaskError("request_class", f"{task.request_class} could not be rebuilt from "
                                         f"its attributes: {exc!r}"[:300]) from None


def _request_class(path: str | None) -> type[Request]:
    """The Request subclass at ``path``, looked up among the modules already imported: a
    stream message never makes a worker import a module."""
    if path is None:
        return Request
    module_name, _, name = path.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        raise TaskError("request_class", f"module {module_name[:200]!r} is not imported in "
                                         "this worker (import it in the spider's module)")
    cls = inspect.getattr_static(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        raise TaskError("request_class", f"{path[:200]!r} is not a scrapy.Request subclass")
    return cls


def _header_bytes(headers: Mapping[str, Any]) -> dict[bytes, list[bytes]]:
    # Latin-1 both ways keeps any byte of a yielded request's headers; text that is not
    # Latin-1 (a seed's header) goes out as UTF-8, as Scrapy sends str headers.
    return {_latin1(k): [_latin1(v) for v in (vs if isinstance(vs, list) else [vs])]
            for k, vs in headers.items()}


def _latin1(text: str) -> bytes:
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8")


def _name_of(spider: Spider | None, func: Any, field: str) -> str | None:
    if func is None:
        return None
    if isinstance(func, str):
        _method(spider, func, field)
        return func
    if field == "callback" and is_default_callback(spider, func):
        return None  # as Scrapy calls it without one
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


def _home(spider: Spider | None) -> str | None:
    """The spider's top-level package (the file's module for ``scrapy runspider``): the items
    that travel in meta and cb_kwargs are of its classes (:mod:`~meteorseed_scrapy.task.tagged`).
    """
    return None if spider is None else type(spider).__module__.split(".")[0]


def _own_spider(spider: Spider | None) -> str | None:
    """The task set of ``spider``'s own requests: its name, when it can name one."""
    try:
        return check_spider(getattr(spider, "name", None))
    except TaskError:
        return None


def request_to_task(request: Request, spider: Spider | None, parent: ExecTask | None) -> ExecTask:
    """A new exec task for a request yielded by ``parent``'s callback (or by ``start()``)."""
    home = _home(spider)
    meta = {k: encode_tagged(f"meta.{k}", v, home) for k, v in request.meta.items()
            if k not in PER_DOWNLOAD_META}
    cb_kwargs = {k: encode_tagged(f"cb_kwargs.{k}", v, home)
                 for k, v in request.cb_kwargs.items()}
    for name, mapping in (("meta", meta), ("cb_kwargs", cb_kwargs)):
        for key, value in mapping.items():
            check_json_safe(f"{name}.{key}", value)
    _check_retry_meta(meta)
    try:
        body, body_b64 = request.body.decode("utf-8"), ""
    except UnicodeDecodeError:
        body, body_b64 = "", base64.b64encode(request.body).decode("ascii")
    if parent is not None:
        seed_id, site_id = parent.seed_id, parent.site_id
    else:
        seed_id = START_SEED_ID
        site_id = str(meta.get("site_id") or getattr(spider, "site_id", None)
                      or getattr(spider, "name", None) or "default")
    cls = type(request)
    class_path = None
    attrs: dict[str, Any] = {}
    if cls is not Request:
        class_path = f"{cls.__module__}.{cls.__qualname__}"
        if _request_class(class_path) is not cls:
            raise TaskError("request_class", f"{class_path} is not found again by its path "
                                             "(define it at a module's top level)")
        attrs = {a: getattr(request, a) for a in cls.attributes if a not in REQUEST_ATTRIBUTES}
        for key, value in attrs.items():
            check_json_safe(f"request_attrs.{key}", value)
    cookies = request.cookies
    task = ExecTask.create(
        seed_id=seed_id,
        site_id=site_id,
        url=request.url,
        method=request.method,
        headers=_headers(request),
        body=body,
        body_b64=body_b64,
        callback=_name_of(spider, request.callback, "callback"),
        errback=_name_of(spider, request.errback, "errback"),
        meta=meta,
        cb_kwargs=cb_kwargs,
        priority=request.priority,
        cookies=dict(cookies) if isinstance(cookies, Mapping) else [
            dict(c) if isinstance(c, Mapping) else c for c in cookies],
        encoding=request.encoding,
        flags=list(request.flags),
        dont_filter=request.dont_filter,
        request_class=class_path,
        request_attrs=attrs,
        # Children stay in their parent's lane (a realtime page's links are realtime too).
        lane=parent.lane if parent is not None else DEFAULT_LANE,
        # ... and belong to its spider; a start request to the spider that made it.
        spider=parent.spider if parent is not None else _own_spider(spider),
    )
    if class_path is not None:
        task_to_request(task, spider)  # a subclass that cannot be rebuilt is refused now
    return task

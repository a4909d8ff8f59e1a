"""Field checks of the task value objects: a failure is a :class:`TaskError` naming the field.

Among them the exec task fields that carry the rest of a ``scrapy.Request`` (cookies, flags,
encoding, class...): a stream message may come from anything that can write to Redis, so each
is checked on decoding."""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import re
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import scrapy

from meteorseed_scrapy.task.lanes import LANES

ID_MAX = 200
_SPACE = re.compile(r"\s")  # the characters str.isspace() accepts, found in C, not in Python


class TaskError(ValueError):
    """A task or seed failed validation; ``field`` names the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check_known_keys(value: Mapping[Any, Any], known: Collection[str], path: str,
                     what: str) -> None:
    """Refuse a key of ``value`` outside ``known`` (a misspelt field would be ignored
    silently): ``<path>.<key>: is not <what> (expected …)``; the first in sorted order."""
    unknown = unknown_keys(value, known, path, what)
    if unknown:
        raise unknown[0]


def unknown_keys(value: Mapping[Any, Any], known: Collection[str], path: str, what: str
                 ) -> list[TaskError]:
    """Each key of ``value`` outside ``known``, sorted, as :func:`check_known_keys` refuses
    it (``path`` ``""``: the keys alone), for a caller that lists every error."""
    extra = value.keys() - known
    if not extra:
        return []
    problem = f"is not {what} (expected {', '.join(sorted(known))})"
    return [TaskError((f"{path}.{key}" if path else key)[:200], problem)
            for key in sorted(str(key) for key in extra)]


def check_id(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TaskError(name, f"must be a non-empty string, got {value!r}"[:300])
    if len(value) > ID_MAX or _SPACE.search(value):
        raise TaskError(name, f"must be at most {ID_MAX} characters without spaces")
    return value


#: Schemes of URLs fetched server-side (seeds' sitemaps, the seeder) and of seeds.
WEB_SCHEMES = ("http", "https")
#: Schemes of exec tasks: the web, and ``data:`` (no network at all). Not ``file`` (a task
#: could read the worker's files into the store), nor ``s3``/``gs`` (it would use the worker's
#: cloud credentials on any bucket it names), nor ``ftp`` (no status codes for the per-site
#: backoff and breaker to judge, and Scrapy's handler may write to the worker's disk).
TASK_SCHEMES = (*WEB_SCHEMES, "data")


def check_url(value: Any, name: str = "url", schemes: tuple[str, ...] = WEB_SCHEMES) -> str:
    """Return ``value`` if it is an absolute URL of one of ``schemes`` (``data:`` URLs have
    no host, the others one), else raise :class:`TaskError`."""
    if not isinstance(value, str) or not value:
        raise TaskError(name, f"must be a non-empty string, got {value!r}"[:300])
    scheme, _, rest = value.partition(":")
    if scheme.lower() not in schemes or (scheme.lower() != "data" and not rest.startswith("//")):
        kinds = "http(s)" if schemes == WEB_SCHEMES else "http(s) or data:"
        raise TaskError(name, f"must be an {kinds} URL, got {value[:200]!r}")
    if scheme.lower() == "data":
        if "," not in rest or _SPACE.search(value):
            raise TaskError(name, f"is not a valid data: URL: {value[:200]!r}")
        return value
    host = rest[2:].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if not host or _SPACE.search(value):
        raise TaskError(name, f"is not a valid URL: {value[:200]!r}")
    return value


#: What ``scrapy.Spider`` itself defines (and older releases did): never a task's callback. A
#: task names a callback the spider author wrote; ``parse`` is the one default callback.
_SPIDER_OWN = frozenset({
    "start", "start_requests", "close", "closed", "from_crawler", "update_settings",
    "handles_request", "log", "logger", "set_crawler", "make_requests_from_url", "crawler",
    "settings", "name", "custom_settings", "allowed_domains", "start_urls", "state",
})
SPIDER_OWN_NAMES = frozenset(_SPIDER_OWN | set(dir(scrapy.Spider))) - {"parse"}

#: Request.meta keys that drive Scrapy's (or this project's) downloading, retries, redirects,
#: cookies and routing: set by Scrapy, a site's rule config or a middleware, never by a seed.
#: Decided one by one from Scrapy's docs and source (docs/seeding.md lists them with why).
RESERVED_META_KEYS = frozenset({
    # where and how a request goes out
    "proxy", "bindaddress", "download_slot", "dont_obey_robotstxt", "allow_offsite",
    "verbatim_url", "is_secure",
    # resource limits (a site's limits: timeout)
    "download_maxsize", "download_warnsize", "download_timeout", "download_fail_on_dataloss",
    "download_latency",
    # dedup, redirects, retries, status handling (a site's limits: retries)
    "dont_filter", "dont_redirect", "redirect_urls", "redirect_reasons", "redirect_times",
    "redirect_ttl", "dont_retry", "max_retry_times", "retry_times", "priority_adjust",
    "handle_httpstatus_all", "handle_httpstatus_list",
    # cookies, credentials, cache
    "cookiejar", "dont_merge_cookies", "http_user", "http_pass", "http_auth_domain",
    "ftp_user", "ftp_password", "ftp_passive", "ftp_local_filename", "dont_cache",
    "cached_response", "cache_timestamp",
    # crawl bookkeeping Scrapy's spider middlewares set on the requests a spider yields
    "depth", "is_start_request",
    # browser rendering (a site's render: browser)
    "playwright",
})
#: Key prefixes reserved likewise: Scrapy's private keys, this project's, scrapy-playwright's.
RESERVED_META_PREFIXES = ("_", "meteorseed_", "playwright_")


def check_callback(value: Any, name: str = "callback", *, private: bool = False) -> str | None:
    """``value`` if it may name a spider callback (or errback): a public method name that is
    not one of ``scrapy.Spider``'s own (``parse`` excepted); else :class:`TaskError`. With
    ``private`` (a task, whose requests a spider yielded), a name starting with one ``_``
    passes too: ``CrawlSpider``'s rules call back ``_callback``. A seed names public ones.
    Whether the spider has such a method is checked where the spider is known."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise TaskError(name, f"must be a method name, got {value!r}"[:300])
    if value.startswith("__") or (value.startswith("_") and not private):
        # __init__ with cb_kwargs would re-run the spider's constructor with chosen arguments.
        raise TaskError(name, f"must name a public spider method, not {value!r} (names "
                              "starting with _ are private)")
    if value in SPIDER_OWN_NAMES:
        raise TaskError(name, f"{value!r} is scrapy.Spider's own, not a callback")
    return value


def check_meta_keys(meta: Mapping[Any, Any], name: str = "meta") -> None:
    """Raise :class:`TaskError` naming ``meta.<key>`` for a key a seed may not set (see
    :data:`RESERVED_META_KEYS`, :data:`RESERVED_META_PREFIXES`)."""
    for key in meta:
        if not isinstance(key, str):
            continue  # (the JSON checks of the seed and its tasks refuse these)
        if key.startswith("meteorseed_"):
            raise TaskError(f"{name}.{key}", "reserved MeteorSeed key")
        if key == "playwright" or key.startswith("playwright_"):
            raise TaskError(f"{name}.{key}", "reserved scrapy-playwright key (rendering "
                                             "comes from the site's rule config)")
        if key in RESERVED_META_KEYS or key.startswith("_"):
            raise TaskError(f"{name}.{key}", "reserved Scrapy key (set by Scrapy, the site's "
                                             "rule config or a middleware, not by a seed)")


#: Longest spider name a task may carry (it is part of Redis key names).
SPIDER_MAX = 100
#: A spider name as a task carries it: word characters (letters and digits of any script,
#: ``_``), ``-`` and ``.``; no ``:`` (it separates the parts of a key), no braces (Redis Cluster
#: hash tags), no spaces or control characters. Scrapy's own names (``genspider``) all fit.
_SPIDER_NAME = re.compile(r"[\w.-]+")


def check_spider(value: Any, name: str = "spider") -> str | None:
    """``value`` if it may name the spider whose workers take a task (None: any worker),
    else :class:`TaskError` naming ``name``."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise TaskError(name, f"must be a non-empty string (a spider's name), got {value!r}"
                        [:300])
    if len(value) > SPIDER_MAX:
        raise TaskError(name, f"must be at most {SPIDER_MAX} characters, got {len(value)}")
    if not _SPIDER_NAME.fullmatch(value) or not value.isprintable():
        raise TaskError(name, "must be a spider's name: letters, digits, '_', '-' and '.' "
                              f"only (no ':', spaces or braces), got {value!r}"[:300])
    return value


def check_lane(value: Any) -> None:
    if value not in LANES:
        raise TaskError("lane", f"must be one of {', '.join(LANES)}, got {value!r}"[:300])


def check_json_safe(name: str, value: Any) -> None:
    """Raise :class:`TaskError` naming ``name`` unless ``value`` encodes as strict JSON in UTF-8
    (the one check of task ``meta``/``cb_kwargs``, whether set directly or by a yielded request).
    """
    try:
        # ensure_ascii=False + encode: a lone surrogate fails here, not later in to_message().
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise TaskError(name, f"is not JSON-serialisable ({exc}): {value!r}"[:300]) from None


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


__all__ = ["CLASS_PATH_MAX", "COOKIE_KEYS", "ID_MAX", "REQUEST_ATTRIBUTES", "RESERVED_META_KEYS",
           "RESERVED_META_PREFIXES", "SPIDER_MAX", "SPIDER_OWN_NAMES", "TASK_SCHEMES",
           "WEB_SCHEMES", "TaskError", "check_callback", "check_cookies", "check_id",
           "check_json_safe", "check_known_keys", "check_lane", "check_meta_keys",
           "check_request_fields", "check_spider", "check_url", "unknown_keys"]

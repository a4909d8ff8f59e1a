"""Which Redis to use: ``METEORSEED_REDIS_URL``, else a scrapy-redis project's own settings.

A project moving from scrapy-redis keeps its connection settings: ``REDIS_URL``, else
``REDIS_HOST`` / ``REDIS_PORT`` / ``REDIS_DB`` / ``REDIS_PARAMS``, read the way
``scrapy_redis.connection.get_redis_from_settings`` reads them (``REDIS_*`` settings win over
``REDIS_PARAMS``; a URL wins over host and port). Everything is folded into one URL, since
every component here connects with ``Redis.from_url``: client options that redis-py accepts as
URL query arguments (socket timeouts, ``retry_on_timeout``...) travel in the query string.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote_plus, urlencode, urlsplit, urlunsplit

logger = logging.getLogger(__name__)

# scrapy-redis's own shortcut settings (connection.SETTINGS_PARAMS_MAP), as client kwargs.
_SHORTCUTS = {"REDIS_URL": "url", "REDIS_HOST": "host", "REDIS_PORT": "port", "REDIS_DB": "db"}
# redis-py parses these from a URL's query string (redis.connection.URL_QUERY_ARGUMENT_PARSERS).
_QUERY_PARAMS = (
    "socket_timeout", "socket_connect_timeout", "socket_keepalive", "retry_on_timeout",
    "max_connections", "health_check_interval", "ssl_check_hostname", "protocol",
)
# Options that only shape scrapy-redis's own client object; ours decides these itself.
_CLIENT_ONLY = frozenset({"redis_cls", "encoding", "decode_responses", "encoding_errors"})
_logged: set[tuple[str, str]] = set()
# One query parameter (a raw "#" or "?" stays in the value: it may be part of a password).
_QUERY_PAIR = re.compile(r"[?&]([^=&]*)=([^&]*)")
_SECRET_KEY = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)


def _setting(settings: object, name: str) -> Any:
    getter = getattr(settings, "get", None)
    return getter(name) if getter is not None else None


def _params(settings: object) -> dict[str, Any]:
    getdict = getattr(settings, "getdict", None)
    if getdict is not None:  # Scrapy settings: accepts a dict or a JSON string from -s
        return dict(getdict("REDIS_PARAMS"))
    raw = _setting(settings, "REDIS_PARAMS")
    return dict(raw) if isinstance(raw, Mapping) else {}


def _query(params: Mapping[str, Any], present: set[str]) -> list[tuple[str, str]]:
    out = []
    for name in _QUERY_PARAMS:
        value = params.get(name)
        if value is None or name in present:
            continue
        out.append((name, str(value).lower() if isinstance(value, bool) else str(value)))
    return out


def _with_params(url: str, params: Mapping[str, Any]) -> str:
    """``url`` plus the ``params`` it lacks; like redis-py's ``from_url(url, **params)``, what
    the URL itself says wins."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is None and params.get("password"):
        user = quote(str(params.get("username") or parts.username or ""), safe="")
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:{quote(str(params['password']), safe='')}@{host}"
    present = {pair.split("=", 1)[0] for pair in parts.query.split("&") if pair}
    path = parts.path
    if path in ("", "/") and "db" not in present and params.get("db") not in (None, ""):
        path = f"/{int(params['db'])}"
    query = "&".join(filter(None, [parts.query, urlencode(_query(params, present))]))
    return urlunsplit(parts._replace(netloc=netloc, path=path, query=query))


def _url_from_params(params: Mapping[str, Any]) -> str:
    if params.get("unix_socket_path"):
        base = f"unix://{params['unix_socket_path']}"
    else:
        scheme = "rediss" if params.get("ssl") else "redis"
        host = str(params.get("host") or "localhost")  # redis-py's defaults, as scrapy-redis
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 literal
        base = f"{scheme}://{host}:{int(params.get('port') or 6379)}"
    return _with_params(base, params)


def redis_url_and_source(settings: object, default: str,
                         own: tuple[str, str] | None = None) -> tuple[str, str]:
    """The Redis URL to use and the name of the setting it came from.

    Order: ``own``, the ``METEORSEED_REDIS_URL`` as :mod:`meteorseed_scrapy.settings`
    resolved it (settings or environment) and its source, else the setting itself;
    scrapy-redis's ``REDIS_URL`` (with ``REDIS_PARAMS`` options it lacks); ``REDIS_HOST`` /
    ``REDIS_PORT`` / ``REDIS_DB`` / ``REDIS_PARAMS``; the ``REDIS_URL`` environment variable;
    ``default``.
    """
    if own is None:
        value = _setting(settings, "METEORSEED_REDIS_URL")
        own = (str(value), "METEORSEED_REDIS_URL") if value else None
    if own is not None:
        return _report(*own)
    params = _params(settings)
    given = []
    for name, key in _SHORTCUTS.items():
        value = _setting(settings, name)
        if value:  # scrapy-redis skips empty values the same way
            params[key] = value
            given.append(name)
    if params.get("url"):
        source = "REDIS_URL" if "REDIS_URL" in given else "REDIS_PARAMS"
        return _report(_with_params(str(params["url"]), params), source, params)
    if given or params:
        names = [*given, *(["REDIS_PARAMS"] if _params(settings) else [])]
        return _report(_url_from_params(params), "/".join(names), params)
    env = os.environ.get("REDIS_URL")
    if env:
        return _report(env, "env REDIS_URL")
    return _report(default, "default")


def _report(url: str, source: str, params: Mapping[str, Any] | None = None) -> tuple[str, str]:
    if (url, source) not in _logged:  # components each resolve it: say it once per process
        _logged.add((url, source))
        logger.info("Redis: %s (from %s)", redact(url), source)
        ignored = sorted(set(params or ()) - _CLIENT_ONLY - set(_QUERY_PARAMS) - {
            "url", "host", "port", "db", "password", "username", "ssl", "unix_socket_path"})
        if ignored:
            logger.warning("REDIS_PARAMS not usable in a Redis URL, ignored: %s",
                           ", ".join(ignored))
    return url, source


def redact(url: str) -> str:
    """``url`` without its passwords, fit for a log line or an error message: the password of
    the user info and the value of every query parameter that names a secret (``?password=``).

    A password is hidden also when it was not percent-encoded: the user info runs to the
    *last* ``@`` (so a raw ``/ : # ? @`` in it is still covered) and a query value to the next
    ``&``. Any URL-like text works: a cluster URL listing several nodes, ``unix://``, a MongoDB
    URI. When in doubt more is hidden, never less.
    """
    spans: list[tuple[int, int]] = []
    scheme_end = url.find("://")
    if scheme_end >= 0:
        start = scheme_end + 3
        at = url.rfind("@", start)
        colon = url.find(":", start, at) if at >= 0 else -1
        if colon >= 0:
            # An empty user name leaves nothing to show: "redis://***@host".
            spans.append((colon + 1 if colon > start else colon, at))
    for match in _QUERY_PAIR.finditer(url):
        if _SECRET_KEY.search(unquote_plus(match.group(1))):
            spans.append(match.span(2))
    out, pos = [], 0
    for begin, end in sorted(spans):
        if begin < pos:  # overlaps the span before (a raw "@" in a query password): join them
            pos = max(pos, end)
            continue
        out.append(url[pos:begin] + "***")
        pos = end
    return "".join(out) + url[pos:]

"""A seed's completion webhook, ``notify``: where its ``finished`` call goes (docs/webhooks.md).

Checked where a seed enters (a seed line, ``POST /dispatch``), with the field named: an
http(s) URL with a host, at most :data:`NOTIFY_URL_MAX` characters, no whitespace or control
character, and no user name or password (the URL is stored with the seed and shown by
``GET /seeds``: the receiver authenticates a call by its signature instead). Whether its
host's addresses may be reached is decided when the call is made, resolved
(:mod:`meteorseed_scrapy.observability.notify`).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from meteorseed_scrapy.task.validation import TaskError, check_url

FIELD = "notify"
NOTIFY_URL_MAX = 2048
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f-\x9f\s]")


def check_notify_url(value: Any, name: str = FIELD) -> str | None:
    """``value`` when it is an acceptable webhook URL (or None: no webhook), else raise
    :class:`TaskError` naming ``name``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TaskError(name, f"must be an http(s) URL or null, got {type(value).__name__}")
    if len(value) > NOTIFY_URL_MAX:
        raise TaskError(name, f"is {len(value)} characters long, more than the limit of "
                              f"{NOTIFY_URL_MAX}")
    if (bad := _BAD_CHARS.search(value)) is not None:
        raise TaskError(name, f"holds a whitespace or control character ({bad.group()!r})")
    check_url(value, name)
    try:
        parts = urlsplit(value)
        host, _port = parts.hostname, parts.port  # (.port raises on a bad port)
    except ValueError as exc:
        raise TaskError(name, f"is not a valid URL ({exc})") from None
    if not host:
        raise TaskError(name, f"has no host: {value[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise TaskError(name, "must not hold a user name or password (it is stored with the "
                              "seed and shown; receivers check the call's signature)")
    return value


__all__ = ["FIELD", "NOTIFY_URL_MAX", "check_notify_url"]

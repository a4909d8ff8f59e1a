"""redact(): no form of a Redis (or store) password survives into a log line or a message."""

from __future__ import annotations

import logging
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy import scrapy_redis_settings
from meteorseed_scrapy.scrapy_redis_settings import redact, redis_url_and_source


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:pw@h:1/0", "redis://***@h:1/0"),
    ("rediss://user:pw@h/2", "rediss://user:***@h/2"),
    ("redis://h:6379/0", "redis://h:6379/0"),
    ("redis://user@h:6379/0", "redis://user@h:6379/0"),
    ("redis://h:6379/0?password=pw&db=1", "redis://h:6379/0?password=***&db=1"),
    ("redis://h/0?socket_timeout=5&pass%77ord=pw", "redis://h/0?socket_timeout=5&pass%77ord=***"),
    ("redis://u:p@h/0?password=q", "redis://u:***@h/0?password=***"),
    ("redis://:p%2Fw%40x%3Ay%23z%3F@h/0", "redis://***@h/0"),
    ("redis://:p/w@x:y#z?q@h:1/0", "redis://***@h:1/0"),  # raw, as typed by hand
    ("redis://h/0?password=a#b?c", "redis://h/0?password=***"),
    ("redis://h:1/0?password=a@b", "redis://h:***"),  # ambiguous: hide more, never less
    ("redis+cluster://u:pw@a:1,b:2,c:3/0", "redis+cluster://u:***@a:1,b:2,c:3/0"),
    ("rediss+cluster://:pw@[::1]:7000,[::2]:7001", "rediss+cluster://***@[::1]:7000,[::2]:7001"),
    ("unix://:pw@/var/run/redis.sock?db=0", "unix://***@/var/run/redis.sock?db=0"),
    ("unix:///var/run/redis.sock?db=0&password=pw", "unix:///var/run/redis.sock?db=0&password=***"),
    ("mongodb://u:pw@m1,m2/db?authSource=admin", "mongodb://u:***@m1,m2/db?authSource=admin"),
    ("sqlite:///var/lib/items.db", "sqlite:///var/lib/items.db"),
])
def test_named_forms(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert redact(shown) == shown


TEMPLATES = [
    "redis://:{pw}@redis.local:6379/0",
    "redis://worker:{pw}@redis.local/1",
    "rediss://worker:{pw}@redis.local:6380/0?ssl_cert_reqs=none",
    "redis://redis.local:6379/0?password={pw}",
    "redis://redis.local/0?db=1&password={pw}&socket_timeout=5",
    "redis+cluster://worker:{pw}@n1:7000,n2:7001,n3:7002/0",
    "rediss+cluster://:{pw}@[::1]:7000,n2:7001",
    "unix://:{pw}@/tmp/redis.sock?db=0",
    "unix:///tmp/redis.sock?db=0&password={pw}",
    "mongodb://worker:{pw}@m1,m2/items?authsource=admin",
]
# Upper-case letters and non-ASCII never occur in a template, nor "%": any of them in the
# redacted text is part of the password. Every piece between special characters has one.
_piece = st.text(st.sampled_from("ABCDEFXYZ\u00e9\u5bc6"), min_size=1, max_size=6)
_password = st.tuples(
    _piece, st.lists(st.tuples(st.sampled_from("/@:#?% =+"), _piece), max_size=4),
).map(lambda p: p[0] + "".join(sep + piece for sep, piece in p[1]))


@given(template=st.sampled_from(TEMPLATES), password=_password, encoded=st.booleans())
def test_no_password_survives(template: str, password: str, encoded: bool) -> None:
    written = quote(password, safe="") if encoded else password
    shown = redact(template.format(pw=written))
    assert password not in shown and written not in shown
    assert not any(c.isupper() or not c.isascii() or c == "%" for c in shown), shown
    assert "***" in shown


def test_the_settings_log_line_is_redacted(caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrapy_redis_settings, "_logged", set())
    url = "redis://h:1/0?password=s%2Fe@cr#et"
    with caplog.at_level(logging.INFO, logger=scrapy_redis_settings.__name__):
        assert redis_url_and_source({"REDIS_URL": url}, "redis://x") == (url, "REDIS_URL")
    assert "Redis: redis://h:***" in caplog.text
    assert "cr#et" not in caplog.text and "s%2Fe" not in caplog.text

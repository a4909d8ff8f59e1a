"""An HTTP-date Retry-After counts from the response's Date header (the server's clock): a
worker whose clock is an hour fast waited 1 s instead of the 20 s asked."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from meteorseed_scrapy.politeness.policy import parse_retry_after


def http_date(moment: datetime) -> bytes:
    return format_datetime(moment, usegmt=True).encode()


@pytest.mark.parametrize("skew_h", [-1, 0, 1])
def test_an_http_date_counts_from_the_server_s_date(skew_h: int) -> None:
    server_now = (datetime.now(timezone.utc) - timedelta(hours=skew_h)).replace(microsecond=0)
    assert parse_retry_after(http_date(server_now + timedelta(seconds=20)),
                             http_date(server_now)) == 20.0


def test_without_a_usable_date_header_it_counts_from_now() -> None:
    soon = datetime.now(timezone.utc) + timedelta(seconds=100)
    for date in (None, b"", b"yesterday", b"Mon, 99 Foo 2026 99:99:99 GMT"):
        seconds = parse_retry_after(http_date(soon), date)
        assert seconds is not None and 90 < seconds <= 100


def test_delta_seconds_and_bad_values_are_unchanged() -> None:
    assert parse_retry_after(b"7", http_date(datetime(2000, 1, 1, tzinfo=timezone.utc))) == 7.0
    assert parse_retry_after(b"soon", b"Mon, 01 Jan 2001 00:00:00 GMT") is None
    past = http_date(datetime(2001, 1, 1, tzinfo=timezone.utc))
    assert parse_retry_after(past, http_date(datetime(2001, 1, 1, 0, 1, tzinfo=timezone.utc))
                             ) == 0.0

"""Small validated value objects for per-site limits and the backoff policy."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from scrapy.exceptions import NotConfigured


def positive_number(name: str, value: Any, kind: type = float, allow_zero: bool = False) -> Any:
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise NotConfigured(f"{name}: expected a number, got {value!r}") from None
    if number < 0 or (number == 0 and not allow_zero):
        raise NotConfigured(f"{name}: must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return number


@dataclass(frozen=True)
class SiteLimits:
    """What one site may receive from the whole fleet."""

    rate: float  # requests per second, summed over all workers
    burst: int  # token-bucket size
    concurrency: int  # requests in flight, summed over all workers
    quota_key: str | None = None  # shared with other sites (one host); None: the site's own
    timeout: float | None = None  # download timeout, seconds; None: Scrapy's DOWNLOAD_TIMEOUT

    @classmethod
    def from_settings(cls, settings: Any) -> SiteLimits:
        return cls(
            rate=positive_number("METEORSEED_SITE_RATE",
                                 settings.get("METEORSEED_SITE_RATE", 2.0)),
            burst=positive_number("METEORSEED_SITE_BURST",
                                  settings.get("METEORSEED_SITE_BURST", 5), int),
            concurrency=positive_number(
                "METEORSEED_SITE_CONCURRENCY", settings.get("METEORSEED_SITE_CONCURRENCY", 4), int
            ),
        )

    def overridden(self, site: Any) -> SiteLimits:
        """These defaults with a site rule config's ``limits`` (``None`` values keep them)."""
        return SiteLimits(
            rate=site.rate if site.rate is not None else self.rate,
            burst=site.burst if site.burst is not None else self.burst,
            concurrency=site.concurrency if site.concurrency is not None else self.concurrency,
            quota_key=site.quota_key,
            timeout=site.timeout if site.timeout is not None else self.timeout,
        )

    def quota(self, site: str) -> str:
        """The name the fleet-wide bucket, leases and pauses of ``site`` live under."""
        return self.quota_key or site


@dataclass(frozen=True)
class Backoff:
    """``min(max, max(retry_after, base * 2**failures)) + jitter`` seconds (redis-py style)."""

    base: float = 1.0
    cap: float = 300.0
    jitter: float = 0.1  # up to this share of the delay is added at random

    def __post_init__(self) -> None:
        positive_number("METEORSEED_BACKOFF_BASE", self.base)
        positive_number("METEORSEED_BACKOFF_MAX", self.cap)
        if self.cap < self.base:
            raise NotConfigured("METEORSEED_BACKOFF_MAX must not be below METEORSEED_BACKOFF_BASE")

    @classmethod
    def from_settings(cls, settings: Any) -> Backoff:
        return cls(
            base=float(settings.get("METEORSEED_BACKOFF_BASE", 1.0)),
            cap=float(settings.get("METEORSEED_BACKOFF_MAX", 300.0)),
        )

    def compute(self, failures: int, retry_after: float | None = None) -> float:
        delay = self.base * 2 ** max(0, min(failures, 30))
        if retry_after is not None:
            delay = max(delay, retry_after)
        delay = min(self.cap, delay)
        return delay + random.uniform(0, delay * self.jitter)


def parse_retry_after(value: bytes | str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent/bad."""
    if not value:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    import datetime as dt
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (when - dt.datetime.now(dt.timezone.utc)).total_seconds())

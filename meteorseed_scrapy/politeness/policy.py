"""Small validated value objects for per-site limits (and each site's, the settings' defaults
overridden by its rule config: :class:`SiteLimitsLookup`) and the backoff policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.backoff import exponential
from meteorseed_scrapy.politeness.adaptive import AdaptiveTarget
from meteorseed_scrapy.settings import (
    DEFAULTS,
    duration_setting,
    flag_setting,
    integer_setting,
    number_setting,
)
from meteorseed_scrapy.validators import ConfigError, to_number

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

    from meteorseed_scrapy.settings import SettingsSource
    from meteorseed_scrapy.sites.lookup import SiteConfigs


@dataclass(frozen=True)
class SiteLimits:
    """What one site may receive from the whole fleet."""

    rate: float  # requests per second, summed over all workers
    burst: int  # token-bucket size
    concurrency: int  # requests in flight, summed over all workers
    quota_key: str | None = None  # shared with other sites (one host); None: the site's own
    timeout: float | None = None  # download timeout, seconds; None: Scrapy's DOWNLOAD_TIMEOUT
    #: rate and concurrency follow the fleet's latency (politeness/adaptive.py), within the above
    adaptive: bool = False
    throttle: AdaptiveTarget = field(default_factory=AdaptiveTarget)
    #: robots.txt Crawl-delay / Request-rate cap the rate (robots obeyed, no override)
    crawl_delay: bool = False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> SiteLimits:
        return cls(
            rate=number_setting(settings, "METEORSEED_SITE_RATE", positive=True),
            burst=integer_setting(settings, "METEORSEED_SITE_BURST", minimum=1),
            concurrency=integer_setting(settings, "METEORSEED_SITE_CONCURRENCY", minimum=1),
            adaptive=flag_setting(settings, "METEORSEED_ADAPTIVE"),
            throttle=AdaptiveTarget.from_settings(settings),
            crawl_delay=bool(settings.getbool("ROBOTSTXT_OBEY")),
        )

    def overridden(self, site: Any, robots: bool = True) -> SiteLimits:
        """These defaults with a site rule config's ``limits`` (``None`` values keep them);
        ``robots``: whether the site obeys robots.txt (its rule config's ``robots``)."""
        return SiteLimits(
            rate=site.rate if site.rate is not None else self.rate,
            burst=site.burst if site.burst is not None else self.burst,
            concurrency=site.concurrency if site.concurrency is not None else self.concurrency,
            quota_key=site.quota_key,
            timeout=site.timeout if site.timeout is not None else self.timeout,
            adaptive=site.adaptive if site.adaptive is not None else self.adaptive,
            throttle=self.throttle,
            crawl_delay=self.crawl_delay and robots and site.ignore_crawl_delay is None,
        )

    def quota(self, site: str) -> str:
        """The name the fleet-wide bucket, leases and pauses of ``site`` live under."""
        return self.quota_key or site


class SiteLimitsLookup:
    """``lookup(site_id)``: the site's :class:`SiteLimits`, hot-reloaded with its rule config
    (computed once per config object, then cached)."""

    def __init__(self, defaults: SiteLimits, configs: SiteConfigs) -> None:
        self.defaults = defaults
        self.configs = configs
        self._limits: dict[str, tuple[Any, SiteLimits]] = {}  # site -> (its config, limits)

    def __call__(self, site_id: str) -> SiteLimits:
        config = self.configs.get(site_id)
        if config is None:
            return self.defaults
        cached = self._limits.get(site_id)
        if cached is None or cached[0] is not config:
            cached = self._limits[site_id] = (
                config, self.defaults.overridden(config.limits, robots=config.robots))
        return cached[1]


@dataclass(frozen=True)
class Backoff:
    """``min(max, max(retry_after, base * 2**failures)) + jitter`` seconds (redis-py style)."""

    base: float = DEFAULTS["METEORSEED_BACKOFF_BASE"]
    cap: float = DEFAULTS["METEORSEED_BACKOFF_MAX"]
    jitter: float = 0.1  # up to this share of the delay is added at random

    def __post_init__(self) -> None:
        to_number(self.base, "METEORSEED_BACKOFF_BASE", positive=True)
        to_number(self.cap, "METEORSEED_BACKOFF_MAX", positive=True)
        if self.cap < self.base:
            raise ConfigError("METEORSEED_BACKOFF_MAX", "must not be below METEORSEED_BACKOFF_BASE"
                              f" ({self.cap:g} < {self.base:g})")

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> Backoff:
        return cls(
            base=duration_setting(settings, "METEORSEED_BACKOFF_BASE", positive=True),
            cap=duration_setting(settings, "METEORSEED_BACKOFF_MAX", positive=True),
        )

    def compute(self, failures: int, retry_after: float | None = None) -> float:
        return exponential(failures, self.base, self.cap, floor=retry_after,
                           jitter=(1.0, 1.0 + self.jitter))


def parse_retry_after(value: bytes | str | None,
                      date: bytes | str | None = None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None when absent/bad.
    An HTTP date counts from the response's ``Date`` header when it has one (the server's
    clock, not this worker's, which may be off by an hour), else from now."""
    if not value:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    import datetime as dt

    when = _http_date(text)
    if when is None:
        return None
    sent = _http_date(date.decode("latin-1") if isinstance(date, bytes) else date)
    return max(0.0, (when - (sent or dt.datetime.now(dt.timezone.utc))).total_seconds())


def _http_date(text: str | None) -> Any:
    """An HTTP date as an aware datetime, or None."""
    import datetime as dt
    from email.utils import parsedate_to_datetime

    if not text:
        return None
    try:
        when = parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)

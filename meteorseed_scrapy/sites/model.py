"""Site rule configs as small frozen value objects (built and validated by :mod:`.schema`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from scrapy.linkextractors import IGNORED_EXTENSIONS

from meteorseed_scrapy.sites.patterns import PatternTimeout, RulePattern
from meteorseed_scrapy.sites.processors import Processor

DEFAULT_NOT_BEFORE = datetime(1990, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Selector:
    """Where values come from: ``css`` or ``xpath`` (HTML), ``path`` (dotted) or ``jmespath``
    (JSON), or the page ``url`` itself; then an optional ``attr`` and ``regex`` (first group,
    else match)."""

    css: str | None = None
    xpath: str | None = None
    path: str | None = None
    from_url: bool = False
    attr: str | None = None
    regex: RulePattern | None = None
    jmespath: str | None = None


@dataclass(frozen=True)
class Constraint:
    min_length: int | None = None
    max_length: int | None = None
    minimum: float | None = None
    maximum: float | None = None
    not_before: datetime | None = None
    not_future: bool = False


@dataclass(frozen=True)
class FieldRule:
    name: str
    select: Selector
    text: bool = False  # cleaned text content of the matched elements (content fields)
    join: str | None = None
    many: bool = False
    processors: tuple[tuple[str, Processor], ...] = ()
    required: bool = False
    constraint: Constraint = field(default_factory=Constraint)


@dataclass(frozen=True)
class Limits:
    """Validated here, enforced by the politeness middlewares (per-site overrides)."""

    rate: float | None = None
    burst: int | None = None
    concurrency: int | None = None
    timeout: float | None = None
    retries: int | None = None
    #: sites naming the same quota key share one fleet-wide rate and concurrency budget
    #: (several sites on one host); None: the site's own
    quota_key: str | None = None
    #: rate and concurrency follow the fleet's latency (None: METEORSEED_ADAPTIVE decides)
    adaptive: bool | None = None
    #: why robots.txt Crawl-delay / Request-rate do not cap this site (None: they do)
    ignore_crawl_delay: str | None = None


@dataclass(frozen=True)
class Rendering:
    mode: str = "none"  # none | browser
    wait_for: str | None = None


@dataclass(frozen=True)
class Follow:
    """How links are followed, as Scrapy's ``LinkExtractor`` does: links to files with
    ``deny_extensions`` (default: ``scrapy.linkextractors.IGNORED_EXTENSIONS``) are skipped,
    URLs are canonicalised (w3lib) unless ``canonicalize`` is false, and ``rel=nofollow`` links
    are skipped only with ``skip_nofollow``."""

    canonicalize: bool = True
    skip_nofollow: bool = False
    deny_extensions: frozenset[str] = frozenset(IGNORED_EXTENSIONS)


@dataclass(frozen=True)
class Dedup:
    """Content fingerprint dedup: ``mode`` mark (set ``duplicate_of``), skip, or off."""

    mode: str = "off"
    title: str = "title"
    content: str = "content"
    window: float = 30 * 86400


@dataclass(frozen=True)
class SiteConfig:
    site_id: str
    version: str
    source: str
    format: str = "html"  # html | json
    allowed_domains: tuple[str, ...] = ()
    start: str = "list"  # what a seed URL is: list | detail
    list_links: Selector | None = None
    list_items: Selector | None = None  # items parsed on the list page itself
    pagination: Selector | None = None
    max_pages: int = 1000
    detail_links: Selector | None = None  # deeper than list -> detail, only when asked
    follow: Follow = field(default_factory=Follow)
    max_depth: int = 1
    remove: tuple[str, ...] = ()  # CSS selectors of nav/footer/ads dropped from text fields
    fields: tuple[FieldRule, ...] = ()
    unique_key: str = "url"  # "url" or a field name
    limits: Limits = field(default_factory=Limits)
    rendering: Rendering = field(default_factory=Rendering)
    headers: dict[str, str] = field(default_factory=dict)
    user_agents: tuple[str, ...] = ()
    proxies: tuple[str, ...] = ()
    robots: bool = True
    cookie_warmup: bool = False  # GET the home page before the first request (per worker)
    blacklist: tuple[RulePattern, ...] = ()
    recrawl_after: float | None = None
    schedule: dict[str, Any] = field(default_factory=dict)
    dedup: Dedup = field(default_factory=Dedup)
    sample_every: int = 100
    jump_threshold: float = 0.5

    def allows(self, url: str) -> bool:
        """Whether a link may be followed: on an allowed domain and on no blacklist pattern."""
        if self._blacklisted(url) is not None:
            return False
        if not self.allowed_domains:
            return True
        from urllib.parse import urlsplit

        host = (urlsplit(url).hostname or "").lower()
        return any(host == d or host.endswith("." + d) for d in self.allowed_domains)

    def refusal(self, url: str) -> str | None:
        """Why a page at ``url`` is not this site's (its blacklist, its allowed domains), or
        None when it is."""
        if self.allows(url):
            return None
        blacklisted = self._blacklisted(url)
        if blacklisted is not None:
            return blacklisted
        from urllib.parse import urlsplit

        host = (urlsplit(url).hostname or "").lower()
        return (f"host {host!r} is not in the allowed domains of site {self.site_id}"
                f" ({', '.join(self.allowed_domains)})")

    def _blacklisted(self, url: str) -> str | None:
        """Why ``url`` is blacklisted, or None; a pattern that runs out of time on it counts as
        a match (the URL is not fetched, and the reason says why)."""
        for pattern in self.blacklist:
            try:
                if pattern.search(url):
                    return (f"matches the blacklist pattern {pattern.pattern!r} of site"
                            f" {self.site_id}")
            except PatternTimeout as exc:
                return f"blacklist of site {self.site_id}: {exc}"
        return None


__all__ = ["DEFAULT_NOT_BEFORE", "Constraint", "Dedup", "FieldRule", "Follow", "Limits",
           "Rendering", "Selector", "SiteConfig"]

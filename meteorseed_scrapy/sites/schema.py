"""Site rule configs, built from one YAML/JSON mapping per site into the value objects of
:mod:`.model`.

See docs/sites.md for the format; its keys are declared in :mod:`.format`, which
:func:`rule_schema` prints as JSON Schema. Fields and selectors are read by :mod:`.field_rules`;
this module reads the rest (lists, limits, rendering, dedup) and checks the whole.
:func:`parse_site` either returns a complete :class:`SiteConfig` or raises
:class:`~meteorseed_scrapy.sites.reader.RuleError` naming the file, the field path and the
problem; nothing half-valid ever reaches the spider.
"""

from __future__ import annotations

import math
import re
from typing import Any

from meteorseed_scrapy.sites import format as rule_keys
from meteorseed_scrapy.sites.field_rules import check_selector, field_rule, section_selector
from meteorseed_scrapy.sites.model import Dedup, Follow, Limits, Rendering, SiteConfig
from meteorseed_scrapy.sites.reader import Reader
from meteorseed_scrapy.sites.shown import shown
from meteorseed_scrapy.sites.spec import json_schema

_SITE_ID = re.compile(rule_keys.SITE_ID)
_QUOTA_KEY = re.compile(rule_keys.QUOTA_KEY)
_IGNORE_REASON = re.compile(rule_keys.IGNORE_REASON)


def _render_reader(top: Reader) -> Reader:
    """``render:`` (or its older name ``rendering:``): ``{mode: browser, wait_for: css}``."""
    if top.has("render") and top.has("rendering"):
        raise top.error("render", "give render or rendering, not both")
    return top.section("rendering" if top.has("rendering") else "render")


def parse_site(data: Any, source: str) -> SiteConfig:
    """A validated :class:`SiteConfig` from one parsed file, or
    :class:`~meteorseed_scrapy.sites.reader.RuleError`."""
    top = Reader(data, source, spec=FORMAT)
    site_id = top.string("site_id", required=True)
    assert site_id is not None
    if not _SITE_ID.fullmatch(site_id):
        raise top.error("site_id", f"letters, digits and _ . - only, got {shown(site_id)}")
    version = top.string("version", required=True, numbers=True)
    fmt = top.string("format", "html") or "html"
    required_names = set(top.str_list("required"))
    fields_reader = top.child("fields", required=True)
    assert fields_reader is not None
    fields = tuple(field_rule(str(name), raw, fields_reader, fmt, str(name) in required_names)
                   for name, raw in fields_reader.data.items())
    fields_reader._used.update(str(name) for name in fields_reader.data)
    names = {rule.name for rule in fields}
    for name in sorted(required_names - names):
        raise top.error("required", f"names {name!r}, which is not among the fields")
    unique_key = top.string("unique_key", "url") or "url"
    if unique_key != "url" and unique_key not in names:
        raise top.error("unique_key", f"must be 'url' or a field name, got {shown(unique_key)}")
    listing = top.section("list")
    list_items = section_selector(listing, "items", fmt)
    if list_items is not None and unique_key == "url":
        raise top.error("unique_key", "sites with list.items yield several items per page:"
                        " name a field as unique_key")
    detail, limits, follow = top.section("detail"), top.section("limits"), top.section("follow")
    rendering = _render_reader(top)
    dedup, sampling, quality = top.section("dedup"), top.section("sampling"), top.section("quality")
    mode = rendering.string("mode", "none") or "none"
    wait_for = rendering.string("wait_for")
    if mode == "browser":
        if not wait_for:
            raise rendering.error("wait_for", "is required when mode is browser")
        if fmt == "json":
            raise rendering.error("mode", "browser rendering is for format: html sites")
        check_selector(rendering, "wait_for", wait_for)
    dedup_cfg = Dedup(mode=dedup.string("mode", "off") or "off",
                      title=dedup.string("title", "title") or "title",
                      content=dedup.string("content", "content") or "content",
                      window=dedup.duration("window", 30 * 86400) or 0.0)
    if dedup_cfg.mode != "off":
        for key in ("title", "content"):
            if getattr(dedup_cfg, key) not in names:
                raise dedup.error(key, f"names {getattr(dedup_cfg, key)!r}, not among the fields")
    schedule = top.raw("schedule", {})
    if not isinstance(schedule, dict):
        raise top.error("schedule", "expected a mapping")
    config = SiteConfig(
        site_id=site_id, version=str(version), source=source, format=fmt,
        allowed_domains=tuple(d.lower() for d in top.str_list("allowed_domains")),
        start=top.string("start", "list") or "list",
        list_links=section_selector(listing, "links", fmt), list_items=list_items,
        pagination=section_selector(listing, "pagination", fmt),
        max_pages=int(listing.number("max_pages", 1000, minimum=1, integer=True) or 1000),
        detail_links=section_selector(detail, "links", fmt),
        max_depth=int(detail.number("max_depth", 1, minimum=1, integer=True) or 1),
        follow=_follow(follow),
        remove=detail.str_list("remove"), fields=fields, unique_key=unique_key,
        limits=Limits(
            rate=_limit(limits, "rate"), burst=_int(_limit(limits, "burst")),
            concurrency=_int(_limit(limits, "concurrency")), timeout=_limit(limits, "timeout"),
            retries=_int(_limit(limits, "retries")), quota_key=_quota_key(limits),
            adaptive=_adaptive(limits),
            ignore_crawl_delay=_ignore_reason(limits)),
        rendering=Rendering(mode, wait_for),
        headers=top.str_map("headers"), user_agents=top.str_list("user_agents"),
        proxies=top.str_list("proxies"), robots=top.flag("robots", True),
        cookie_warmup=top.flag("cookie_warmup", False),
        blacklist=tuple(top.pattern("blacklist", p) for p in top.str_list("blacklist")),
        recrawl_after=top.duration("recrawl_after", None), schedule=dict(schedule),
        dedup=dedup_cfg,
        sample_every=int(sampling.number("every", 100, integer=True) or 0),
        jump_threshold=float(quality.number("jump_threshold", 0.5) or 0.5),
    )
    for proxy in config.proxies:
        if not re.match(r"^(https?|socks5h?)://", proxy):
            raise top.error("proxies", f"expected http(s):// or socks5:// URLs, got {shown(proxy)}")
    if not config.list_links and not config.list_items and config.start == "list" \
            and not config.pagination:
        raise listing.error("links", "a list-start site needs list.links, list.items or"
                            " list.pagination")
    for reader in (limits, rendering, dedup, sampling, quality, listing, detail, follow, top):
        reader.done()
    return config


#: ``limits`` ranges: (least, most, whole number). Within them lua/gate.lua's arithmetic stays
#: exact even at the slowest rate with the breaker's ramp and a 429's tightening (its bucket TTL,
#: burst / rate in ms, stays below the 1e17 Redis still reads as an integer); outside them a
#: value is a typo, not a policy. rate: requests a second; timeout: seconds.
LIMITS: dict[str, tuple[float, float, bool]] = {
    "rate": (1e-5, 1e6, False), "burst": (1, 10_000, True), "concurrency": (1, 10_000, True),
    "timeout": (0.0, 86_400.0, False), "retries": (0, 1000, True),
}


def _limit(limits: Reader, key: str) -> float | None:
    """A ``limits`` value: absent, or a finite number within :data:`LIMITS` (positive, but for
    retries); anything else, null included, is refused naming the field."""
    if key not in limits.data:
        return None
    value = limits.raw(key)
    least, most, whole = LIMITS[key]
    zero_ok = key == "retries"  # 0 retries is a policy; 0 requests a second is a stalled site
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and not math.isfinite(value)) \
            or value < 0 or (value == 0 and not zero_ok):
        kind = "finite number >= 0" if zero_ok else "positive finite number"
        raise limits.error(key, f"must be a {kind}, got {_shown(value)}")
    if not least <= value <= most:
        raise limits.error(key, f"must be between {least:g} and {most:g}, got {_shown(value)}")
    if whole and value != int(value):
        raise limits.error(key, f"must be a whole number, got {_shown(value)}")
    return int(value) if whole else float(value)


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"  # repr() refuses ints of 4300+ digits
    return repr(value)[:100]


def _quota_key(limits: Reader) -> str | None:
    key = limits.string("quota_key")
    if key is not None and not _QUOTA_KEY.fullmatch(key):
        raise limits.error("quota_key",
                           f"expected letters, digits, '_.:-' (1-200), got {shown(key)}")
    return key


def _adaptive(limits: Reader) -> bool | None:
    """True or false; absent (or null): None, the project's METEORSEED_ADAPTIVE decides."""
    flag = limits.flag("adaptive", False)
    return flag if limits.has("adaptive") else None


def _ignore_reason(limits: Reader) -> str | None:
    reason = limits.string("ignore_crawl_delay")
    if reason is not None and not _IGNORE_REASON.fullmatch(reason):
        raise limits.error("ignore_crawl_delay", "expected the reason robots.txt's rate is"
                           f" ignored (3-200 characters, one line), got {shown(reason)}")
    return reason


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _follow(follow: Reader) -> Follow:
    default = Follow()
    extensions = follow.raw("deny_extensions")
    return Follow(
        canonicalize=follow.flag("canonicalize", default.canonicalize),
        skip_nofollow=follow.flag("skip_nofollow", default.skip_nofollow),
        # as LinkExtractor's deny_extensions: without the dot, compared case-insensitively
        deny_extensions=default.deny_extensions if extensions is None else frozenset(
            e.lower().lstrip(".") for e in follow.str_list("deny_extensions")))


#: The rule format (:mod:`.format`) with this module's limit ranges.
FORMAT = rule_keys.rule_format(LIMITS)


def rule_schema() -> dict[str, Any]:
    """The JSON Schema of a rule file: what ``meteorseed sites schema`` prints."""
    schema = json_schema(FORMAT)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://meteorseed.invalid/schemas/site-rules.json",
            "title": "MeteorSeed site rule file", **schema}


__all__ = ["FORMAT", "LIMITS", "parse_site", "rule_schema"]

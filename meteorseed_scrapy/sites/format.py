"""Every key of a site rule file, declared once (see :mod:`.spec`): read by :mod:`.schema`'s
validator, printed as JSON Schema by ``meteorseed sites schema``. docs/sites.md explains them."""

from __future__ import annotations

from collections.abc import Mapping

from meteorseed_scrapy.sites.processors import OPTIONS
from meteorseed_scrapy.sites.spec import (
    Key,
    anything,
    duration,
    flag,
    number,
    section,
    string,
    string_map,
    strings,
)

SITE_ID = r"^[A-Za-z0-9_.-]{1,100}$"
FIELD_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,99}$"
QUOTA_KEY = r"^[A-Za-z0-9_.:-]{1,200}$"
#: A reason given for ignoring robots.txt's rate: words, not blank, one line, at most 200.
IGNORE_REASON = r"^(?=.*[^\s])[^\x00-\x1f\x7f]{3,200}$"
#: Fields the spider or the store stage set: a rule may not define them.
RESERVED = frozenset({"_id", "site_id", "seed_id", "task_id", "updated_at", "first_seen_at",
                      "rule_version", "duplicate_of", "content_fingerprint"})

#: Where a value comes from: exactly one of css, xpath, path, jmespath, from_url.
SELECTOR: dict[str, Key] = {
    "css": string("CSS selector, parsel's (::text, ::attr(name)); html sites", example="h1"),
    "xpath": string("XPath 1.0 (with EXSLT re:); html sites", example="//h1"),
    "path": string("dotted path in the JSON (salary.min, jobs.0.id); json sites",
                   example="title"),
    "jmespath": string("JMESPath expression, as parsel's Selector.jmespath; json sites",
                       example="title"),
    "from_url": flag("the page URL itself"),
    "attr": string("this attribute of each matched element", example="href"),
    "regex": string("first group (else the match) of each value", example="(.+)"),
}
_SHORTHAND = {"type": "string", "description": "css (html sites) or path (json sites)"}
LINKS = section("a selector of URLs (elements: their a/area href, as LinkExtractor)", SELECTOR,
                shorthand=_SHORTHAND)
FIELD = section("one item field", {
    **SELECTOR,
    "processors": Key(None, "applied in order; a failure empties the field (an anomaly)",
                      variants=OPTIONS),
    "text": flag("cleaned text of the matched elements"),
    "join": string("join several values with this", example=" "),
    "many": flag("a list of every value"),
    "required": flag("empty is an anomaly"),
    "min_length": number("shortest text/list", minimum=0, whole=True),
    "max_length": number("longest text/list", minimum=0, whole=True),
    "min": number("least number (or price amount)", example=0),
    "max": number("greatest number (or price amount)", example=10),
    "not_before": anything("earliest date (dates default to 1990-01-01)",
                           {"type": "string", "format": "date"}, example="2000-01-01"),
    "not_future": flag("a date after the check is an anomaly (dates default to true)"),
}, shorthand=_SHORTHAND)


def rule_format(limits: Mapping[str, tuple[float, float, bool]]) -> Key:
    """The whole format; ``limits``: :data:`.schema.LIMITS` (least, most, whole number)."""
    render = section("browser rendering", {
        "mode": string("none, or browser (Chromium through scrapy-playwright)",
                       enum=("none", "browser")),
        "wait_for": string("CSS selector the rendered page is parsed after", example="div")})
    limit_keys = {name: number(f"per-site {name}", minimum=least, maximum=most, whole=whole)
                  for name, (least, most, whole) in limits.items()}
    limit_keys["quota_key"] = string("sites sharing it share one rate and concurrency budget",
                                     pattern=QUOTA_KEY, example="shared")
    limit_keys["adaptive"] = flag("rate and concurrency follow the latency the whole fleet"
                                  " observes (AutoThrottle, fleet-wide); default:"
                                  " METEORSEED_ADAPTIVE")
    limit_keys["ignore_crawl_delay"] = string(
        "why robots.txt Crawl-delay and Request-rate do not cap this site (the reason is"
        " logged)", pattern=IGNORE_REASON, example="written permission from the site owner")
    return section("a site rule file", {
        "site_id": string("letters, digits, _ . -", pattern=SITE_ID, example="news"),
        "version": Key({"type": ["string", "number"]}, "stored as rule_version", example=2),
        "format": string("html or json pages", enum=("html", "json")),
        "allowed_domains": strings("links and pages off these domains are refused",
                                   example=["news.example"]),
        "start": string("what a seed URL is", enum=("list", "detail")),
        "list": section("list pages", {
            "links": LINKS, "items": LINKS, "pagination": LINKS,
            "max_pages": number("list pages followed at most", minimum=1, whole=True)}),
        "detail": section("detail pages", {
            "links": LINKS,
            "max_depth": number("detail pages deep", minimum=1, whole=True),
            "remove": strings("CSS of elements left out of text fields", example=["nav"])}),
        "follow": section("link following (Scrapy's LinkExtractor rules)", {
            "canonicalize": flag("request canonical URLs (w3lib)"),
            "skip_nofollow": flag("skip links with rel=nofollow"),
            "deny_extensions": strings("file extensions never followed (default: Scrapy's"
                                       " IGNORED_EXTENSIONS; [] follows all)", example=["pdf"]),
        }),
        "fields": Key(None, "the item's fields", values=FIELD,
                      names={"pattern": FIELD_NAME, "not": {"enum": sorted(RESERVED)}}),
        "unique_key": string("url, or a field whose value keys the document", example="url"),
        "required": strings("fields that may not be empty", example=["title"]),
        "dedup": section("repost detection by content fingerprint", {
            "mode": string("mark, skip or off", enum=("off", "mark", "skip")),
            "title": string("title field", example="title"),
            "content": string("content field", example="content"),
            "window": duration("how long a fingerprint is remembered")}),
        "sampling": section("log 1 item in N", {"every": number("N (0: never)", whole=True)}),
        "quality": section("anomaly-rate jump warning", {
            "jump_threshold": number("rate rise that is a jump", example=0.5)}),
        "limits": section("politeness overrides", limit_keys),
        "render": render,
        "rendering": render,  # the older name of render
        "headers": string_map("headers of every request"),
        "user_agents": strings("User-Agents, one per request in turn"),
        "proxies": strings("proxy URLs", example=["http://proxy.example:3128"]),
        "robots": flag("obey robots.txt"),
        "cookie_warmup": flag("GET the home page first"),
        "blacklist": strings("regexes of URLs never fetched", example=["/login"]),
        "recrawl_after": duration("re-crawl a page after"),
        "schedule": anything("seed schedule", {"type": "object"}, example={"every": "6h"}),
    }, required=("site_id", "version", "fields"))


__all__ = ["FIELD", "FIELD_NAME", "IGNORE_REASON", "LINKS", "QUOTA_KEY", "RESERVED",
           "SELECTOR", "SITE_ID", "rule_format"]

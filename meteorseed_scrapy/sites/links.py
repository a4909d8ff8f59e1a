"""The links a site's rules follow, with the semantics of Scrapy's ``LinkExtractor``.

A link rule (``list.links``, ``list.pagination``, ``detail.links``) whose CSS/XPath matches
elements is handed to Scrapy's ``LinkExtractor`` itself, as ``restrict_xpaths``: the ``a`` and
``area`` ``href``s inside those elements, as a ``CrawlSpider`` rule would find them. A rule that
picks values (``::attr(href)``, ``attr``, ``regex``, ``::text``, JSON ``path``/``jmespath``)
cannot be one (``LinkExtractor`` only scans attributes of elements), so each value goes through
the steps ``LinkExtractor`` applies to an ``href``, with Scrapy's and w3lib's own functions:
whitespace stripped (HTML5), joined with the page's ``<base>``, made safe (percent-encoded in
the page's encoding), and ``rel=nofollow`` read from the element the value came from.

Then every link, either way, is checked as ``LinkExtractor`` would check it: http(s) only,
none of the site's ``follow.deny_extensions`` (Scrapy's ``IGNORED_EXTENSIONS`` unless the rule
says otherwise), canonicalised (w3lib ``canonicalize_url``) unless ``follow.canonicalize`` is
false, once; ``rel=nofollow`` links are skipped with ``follow.skip_nofollow``; and the site's
allowed domains and blacklist apply.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

from lxml import etree
from scrapy.http import Response, TextResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.utils.misc import rel_has_nofollow
from scrapy.utils.response import get_base_url
from scrapy.utils.url import url_has_any_extension
from w3lib.html import strip_html5_whitespace
from w3lib.url import canonicalize_url, safe_url_string

from meteorseed_scrapy.sites.extract import find, select_values, xpath_of
from meteorseed_scrapy.sites.model import Selector, SiteConfig
from meteorseed_scrapy.sites.patterns import PatternTimeout
from meteorseed_scrapy.sites.processors import ProcessorError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Link:
    """A link a rule found: followed when ``skipped`` is None, else why not."""

    url: str
    skipped: str | None = None


def follow(config: SiteConfig, scope: Any, rule: Selector, response: Response) -> list[str]:
    """The URLs to request: what :func:`links` does not skip."""
    return [link.url for link in links(config, scope, rule, response) if link.skipped is None]


def links(config: SiteConfig, scope: Any, rule: Selector, response: Response) -> list[Link]:
    """Every link ``rule`` finds on the page, in page order, each followed or with a reason."""
    if not isinstance(response, TextResponse):
        return []  # a binary body has no links to read
    try:
        found = _found(config, scope, rule, response)
    except ProcessorError as exc:  # a JMESPath type error on this page's data, a regex timeout
        logger.warning("Site %s: link rule failed on %s: %s", config.site_id, response.url, exc)
        return []
    out: list[Link] = []
    seen: set[str] = set()
    policy = config.follow
    extensions = {"." + e for e in policy.deny_extensions}
    for url, nofollow in found:
        if url.split("://", 1)[0].lower() not in ("http", "https"):
            out.append(Link(url, "not an http(s) URL"))
            continue
        if policy.canonicalize:
            url = canonicalize_url(url)
        if url in seen:
            continue
        seen.add(url)
        if extensions and url_has_any_extension(url, extensions):
            out.append(Link(url, "a file extension that is not followed (follow.deny_extensions)"))
        elif nofollow and policy.skip_nofollow:
            out.append(Link(url, "rel=nofollow (follow.skip_nofollow)"))
        elif not config.allows(url):
            out.append(Link(url, "off the allowed domains, or blacklisted"))
        else:
            out.append(Link(url))
    return out


def _found(config: SiteConfig, scope: Any, rule: Selector,
           response: TextResponse) -> list[tuple[str, bool]]:
    """(absolute URL, rel=nofollow) of each link value of ``rule``."""
    if config.format == "json" or rule.from_url:
        return [(url, False) for value in select_values(scope, rule, response.url)
                if (url := _absolute(str(value), response.url, response)) is not None]
    nodes = find(scope, rule, smart=True)
    if nodes and rule.attr is None and rule.regex is None and all(
            isinstance(node, etree._Element) for node in nodes):
        # Regions: Scrapy's LinkExtractor itself, filters left to links() (one place for both)
        extractor = LinkExtractor(restrict_xpaths=xpath_of(rule), deny_extensions=[],
                                  unique=False)
        return [(link.url, link.nofollow) for link in extractor.extract_links(response)]
    base = get_base_url(response)
    out = []
    deadline = time.monotonic() + rule.regex.budget if rule.regex is not None else None
    for node in nodes:
        if isinstance(node, etree._Element):
            owner, value = node, node.get(rule.attr or "href")
        elif isinstance(node, str):  # an attribute or text: a smart string knows its element
            owner = node.getparent() if hasattr(node, "getparent") else None
            value = None if rule.attr else node
        else:  # a number or boolean of an XPath function: no link
            continue
        if value is None:
            continue
        if rule.regex is not None:
            try:
                match = rule.regex.search(value, deadline)
            except PatternTimeout as exc:
                raise ProcessorError(str(exc)) from None
            if match is None:
                continue
            value = match.group(1) if match.groups() else match.group(0)
        url = _absolute(value, base, response)
        if url is not None:
            rel = owner.get("rel") if owner is not None and hasattr(owner, "get") else None
            out.append((url, rel_has_nofollow(rel)))
    return out


def _absolute(value: str, base: str, response: TextResponse) -> str | None:
    """``value`` as LinkExtractor makes an ``href`` absolute; None for a bogus one."""
    try:
        url = safe_url_string(urljoin(base, strip_html5_whitespace(value)),
                              encoding=response.encoding)
    except ValueError:
        return None
    return urljoin(response.url, url)


__all__ = ["Link", "follow", "links"]

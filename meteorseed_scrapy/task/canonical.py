"""Canonical forms: of a URL (dedup, default document keys) and its fingerprint, and of a JSON
value (stable text: equal values, equal text)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from w3lib.url import canonicalize_url

# URLs that w3lib's canonicalize_url returns unchanged, recognised without parsing them: a
# lowercase http(s) scheme; a lowercase ASCII host of LDH labels (no "--", so no punycode; the
# last label starts with a letter, so no IPv4) without port or userinfo; a path of unreserved
# characters (dot segments are checked apart); an optional query of key=value pairs of
# unreserved characters, already in sorted order; no fragment. tests/test_tasks.py compares
# this with w3lib over many varied URLs.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_UNRESERVED = r"[A-Za-z0-9._~-]"
AS_IS_URL = re.compile(
    rf"https?://((?:{_LABEL}\.)*[a-z](?:[a-z0-9-]{{0,61}}[a-z0-9])?)"
    rf"(/[A-Za-z0-9._~/-]*)"
    rf"(?:\?({_UNRESERVED}+={_UNRESERVED}*(?:&{_UNRESERVED}+={_UNRESERVED}*)*))?"
)
_DOT_SEGMENT = re.compile(r"/\.\.?(?:/|$)")

#: For a loop over many URLs that inlines the test (seed expansion): a URL of at most
#: AS_IS_MAX_LEN characters that AS_IS_URL fullmatches and that holds none of "&", "/." and
#: "--" is canonical as it is (its host is then at most 253 characters without "--", its path
#: has no dot segment, its query one pair at most). Whatever AS_IS_URL fullmatches is also an
#: http(s) URL with a host and no whitespace, of ASCII characters that a JSON string holds
#: unescaped.
AS_IS_MAX_LEN = 253 + len("https://")


def _is_canonical(url: str) -> bool:
    match = AS_IS_URL.fullmatch(url)
    if match is None:
        return False
    host, path, query = match.groups()
    if len(host) > 253 or "--" in host or ("/." in path and _DOT_SEGMENT.search(path)):
        return False
    if query and "&" in query:
        pairs = [tuple(pair.split("=", 1)) for pair in query.split("&")]
        if pairs != sorted(pairs):
            return False
    return True


def canonical_url(url: str) -> str:
    """The URL form used for dedup and for default document keys (w3lib's canonicalize_url;
    a URL already in that form is recognised and returned without parsing it)."""
    if _is_canonical(url):
        return url
    return canonicalize_url(url, keep_fragments=False)


def url_hash(url: str) -> str:
    """Hex SHA-256 of the canonical URL (the default ``unique_key`` of stored documents)."""
    return hashlib.sha256(canonical_url(url).encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> str:
    """Stable text of a JSON value (sorted keys, no spaces): equal values, equal text. Strict
    JSON: NaN and Infinity raise ``ValueError`` (stored, they would be text that no strict
    reader takes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


__all__ = ["AS_IS_MAX_LEN", "AS_IS_URL", "canonical_json", "canonical_url", "url_hash"]

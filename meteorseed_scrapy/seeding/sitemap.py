"""``sitemap`` seeds: URLs from a sitemap.xml or a sitemap index, fetched over HTTP.

``{"url": "https://s/sitemap.xml", "lastmod_after": "2024-01-01"}``. Sitemaps are fetched with
urllib (timeouts, a byte limit before and after gunzip) and parsed as a stream with expat, so
a 50 000-URL sitemap is never held as a document. DOCTYPEs and entities are refused (no XML
bombs). An index's child sitemaps are fetched in turn (one level deep, as the protocol says);
a child that fails is reported and the others still go through. Entries without ``lastmod``
pass the ``lastmod_after`` filter (nothing says they are old).
"""

from __future__ import annotations

import datetime as dt
import gzip
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Mapping
from typing import IO, Any
from xml.parsers import expat

from meteorseed_scrapy.task.validation import TaskError, check_url

MAX_SITEMAP_BYTES = 50 * 1024 * 1024  # the protocol's limit, uncompressed
MAX_SITEMAP_URLS = 50_000  # per sitemap file, as the protocol says
MAX_CHILD_SITEMAPS = 1000
FETCH_TIMEOUT = 30.0
_CHUNK = 64 * 1024


class SitemapError(Exception):
    """A sitemap that could not be fetched or parsed (the reason is the message)."""


def check_sitemap_payload(payload: Mapping[str, Any]) -> tuple[str, dt.date | None]:
    url = check_url(payload.get("url"), "payload.url")
    after = payload.get("lastmod_after")
    if after is None:
        return url, None
    try:
        return url, dt.date.fromisoformat(str(after)[:10])
    except ValueError:
        raise TaskError("payload.lastmod_after", f"must be a YYYY-MM-DD date, got {after!r}"
                        [:200]) from None


def expand_sitemap(payload: Mapping[str, Any], timeout: float = FETCH_TIMEOUT
                   ) -> Iterator[str | SitemapError]:
    """Page URLs of the sitemap (or index); a failing child sitemap yields a SitemapError.

    A failure of the sitemap named by the seed itself raises :class:`SitemapError`.
    """
    url, after = check_sitemap_payload(payload)
    kind, locs = _read(url, timeout)
    if kind == "urlset":
        yield from _filtered(locs, after)
        return
    for children, (child, _lastmod) in enumerate(locs, start=1):
        if children > MAX_CHILD_SITEMAPS:
            yield SitemapError(f"index {url} lists more than {MAX_CHILD_SITEMAPS} sitemaps")
            return
        try:
            child_kind, child_locs = _read(child, timeout)
            if child_kind != "urlset":
                raise SitemapError(f"sitemap {child[:200]}: an index inside an index")
            yield from _filtered(child_locs, after)
        except SitemapError as exc:
            yield exc


def _filtered(locs: list[tuple[str, str]], after: dt.date | None) -> Iterator[str]:
    for loc, lastmod in locs:
        if after is not None and lastmod:
            try:
                if dt.date.fromisoformat(lastmod[:10]) < after:
                    continue
            except ValueError:
                pass  # an unreadable lastmod does not prove the page old
        yield loc


def _read(url: str, timeout: float) -> tuple[str, list[tuple[str, str]]]:
    """(root element name, [(loc, lastmod)]) of one sitemap file."""
    check_url(url, "sitemap")
    request = urllib.request.Request(url, headers={"User-Agent": "meteorseed-seed-expand"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            gzipped = url.endswith(".gz") or response.headers.get("Content-Encoding") == "gzip"
            return _parse(response, gzipped, url)
    except urllib.error.HTTPError as exc:
        raise SitemapError(f"sitemap {url[:200]}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SitemapError(f"sitemap {url[:200]}: cannot fetch ({reason})") from None


def _parse(stream: IO[bytes], gzipped: bool, url: str) -> tuple[str, list[tuple[str, str]]]:
    parser = expat.ParserCreate(namespace_separator=" ")
    state: dict[str, Any] = {"root": "", "tag": "", "loc": "", "lastmod": "", "text": []}
    out: list[tuple[str, str]] = []

    def refuse(*_: Any) -> None:
        raise SitemapError(f"sitemap {url[:200]}: DOCTYPE/entities are not accepted")

    def start(name: str, _attrs: Any) -> None:
        local = name.rsplit(" ", 1)[-1]
        if not state["root"]:
            if local not in ("urlset", "sitemapindex"):
                raise SitemapError(f"sitemap {url[:200]}: root element is <{local}>")
            state["root"] = local
        state["tag"] = local
        state["text"] = []

    def end(name: str) -> None:
        local = name.rsplit(" ", 1)[-1]
        if local in ("loc", "lastmod"):
            state[local] = "".join(state["text"]).strip()
        elif local in ("url", "sitemap"):
            if state["loc"]:
                out.append((state["loc"], state["lastmod"]))
                if len(out) > MAX_SITEMAP_URLS:
                    raise SitemapError(f"sitemap {url[:200]}: more than {MAX_SITEMAP_URLS} "
                                       "entries")
            state["loc"], state["lastmod"] = "", ""
        state["text"] = []

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = lambda data: state["text"].append(data)
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    size = 0
    try:
        while chunk := stream.read(_CHUNK):
            data = inflate.decompress(chunk, MAX_SITEMAP_BYTES + 1 - size) if inflate else chunk
            size += len(data)
            if size > MAX_SITEMAP_BYTES:
                raise SitemapError(f"sitemap {url[:200]}: larger than {MAX_SITEMAP_BYTES} bytes")
            parser.Parse(data, False)
        parser.Parse(b"", True)
    except (expat.ExpatError, zlib.error, gzip.BadGzipFile) as exc:
        raise SitemapError(f"sitemap {url[:200]}: not a valid sitemap ({exc})") from None
    return state["root"], out

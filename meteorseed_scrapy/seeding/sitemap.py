"""``sitemap`` seeds: URLs from a sitemap.xml or a sitemap index, fetched over HTTP.

``{"url": "https://s/sitemap.xml", "lastmod_after": "2024-01-01"}``. Sitemaps are fetched by
:class:`~meteorseed_scrapy.seeding.fetch.Fetcher` under the site's
:class:`~meteorseed_scrapy.seeding.fetch.FetchPolicy` (no private addresses unless
``METEORSEED_FETCH_PRIVATE_ADDRESSES``, redirects checked hop by hop, a whole-request deadline,
the site's headers, User-Agent and robots.txt, its allowed domains) and parsed as a stream with
expat under a byte limit before and after gunzip, so a 50 000-URL sitemap is never held as a
document. DOCTYPEs and entities are refused (no XML bombs). An index's child sitemaps are
fetched in turn (one level deep, as the protocol says); a child that fails is reported and the
others still go through. A listed URL outside the site's allowed domains is reported at its
position. Entries without ``lastmod`` pass the ``lastmod_after`` filter (nothing says they are
old).
"""

from __future__ import annotations

import datetime as dt
import gzip
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol
from xml.parsers import expat

from meteorseed_scrapy.seeding.fetch import Fetcher, FetchError, FetchPolicy
from meteorseed_scrapy.task.validation import TaskError, check_url

MAX_SITEMAP_BYTES = 50 * 1024 * 1024  # the protocol's limit, uncompressed
MAX_SITEMAP_URLS = 50_000  # per sitemap file, as the protocol says
MAX_CHILD_SITEMAPS = 1000
_CHUNK = 64 * 1024


class _Stream(Protocol):
    def read(self, n: int, /) -> bytes: ...


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


def expand_sitemap(payload: Mapping[str, Any], policy: FetchPolicy | None = None
                   ) -> Iterator[str | SitemapError | TaskError]:
    """Page URLs of the sitemap (or index), fetched under ``policy`` (default: the safe one,
    no private addresses); a failing child sitemap yields a :class:`SitemapError`, a URL
    outside the site's allowed domains a :class:`TaskError`, each at its position.

    A failure of the sitemap named by the seed itself raises :class:`SitemapError`.
    """
    url, after = check_sitemap_payload(payload)
    fetcher = Fetcher(policy or FetchPolicy())
    kind, locs = _read(fetcher, url)
    if kind == "urlset":
        yield from _filtered(fetcher.policy, locs, after)
        return
    for children, (child, _lastmod) in enumerate(locs, start=1):
        if children > MAX_CHILD_SITEMAPS:
            yield SitemapError(f"index {url} lists more than {MAX_CHILD_SITEMAPS} sitemaps")
            return
        try:
            child_kind, child_locs = _read(fetcher, child)
            if child_kind != "urlset":
                raise SitemapError(f"sitemap {child[:200]}: an index inside an index")
            yield from _filtered(fetcher.policy, child_locs, after)
        except SitemapError as exc:
            yield exc


def _filtered(policy: FetchPolicy, locs: list[tuple[str, str]], after: dt.date | None
              ) -> Iterator[str | TaskError]:
    for loc, lastmod in locs:
        if after is not None and lastmod:
            try:
                if dt.date.fromisoformat(lastmod[:10]) < after:
                    continue
            except ValueError:
                pass  # an unreadable lastmod does not prove the page old
        problem = policy.domain_problem(loc)
        yield loc if problem is None else TaskError("url", problem)


def _read(fetcher: Fetcher, url: str) -> tuple[str, list[tuple[str, str]]]:
    """(root element name, [(loc, lastmod)]) of one sitemap file."""
    try:
        with fetcher.open(url) as response:
            if not 200 <= response.status < 300:
                raise SitemapError(f"sitemap {url[:200]}: HTTP {response.status}")
            gzipped = response.url.endswith(".gz") or \
                response.headers.get("Content-Encoding") == "gzip"
            return _parse(response, gzipped, url)
    except FetchError as exc:
        raise SitemapError(f"sitemap {url[:200]}: {exc}") from None


def _parse(stream: _Stream, gzipped: bool, url: str) -> tuple[str, list[tuple[str, str]]]:
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
        while chunk := stream.read(_CHUNK):  # (a FetchError ends it: deadline, cut-off)
            data = inflate.decompress(chunk, MAX_SITEMAP_BYTES + 1 - size) if inflate else chunk
            size += len(data)
            if size > MAX_SITEMAP_BYTES:
                raise SitemapError(f"sitemap {url[:200]}: larger than {MAX_SITEMAP_BYTES} bytes")
            parser.Parse(data, False)
        parser.Parse(b"", True)
    except (expat.ExpatError, zlib.error, gzip.BadGzipFile) as exc:
        raise SitemapError(f"sitemap {url[:200]}: not a valid sitemap ({exc})") from None
    return state["root"], out

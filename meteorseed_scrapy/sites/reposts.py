"""Content fingerprints: the same article reposted under another URL is recognised.

The fingerprint is the SHA-1 of the normalised title and the first 100 characters of the
normalised content (case folded, punctuation dropped, whitespace collapsed), so markup,
tracking parameters and trailing boilerplate do not hide a repost. The first document seen
with a fingerprint owns it for the site's dedup window: ``<ns>:{<site>}:fp:<sha1>`` holds its
document id and expires after the window (see :mod:`meteorseed_scrapy.queue.keys`).

With ``METEORSEED_REPOSTS_ACROSS_SITES = True`` the index is the namespace's, not each site's:
``<ns>:fp:<sha1>`` holds the first document of *any* site with that fingerprint, so an article
syndicated under another ``site_id`` is marked (``duplicate_of``) or skipped as its site's
``dedup.mode`` says. Only sites with dedup on take part (one whose mode is ``off`` neither
claims nor checks fingerprints), and the key expires after the window of the site that claimed
it. A setting rather than a rule field: the index must be the same for every site of the
namespace, or a site checking the shared index would miss the articles of one that does not
write to it.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.keys import KeyLayout

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

CONTENT_CHARS = 100
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalise(text: Any) -> str:
    if isinstance(text, list):
        text = " ".join(str(part) for part in text)
    return _NON_WORD.sub(" ", str(text or "").casefold()).strip()


def content_fingerprint(title: Any, content: Any) -> str:
    material = normalise(title) + "\n" + normalise(content)[:CONTENT_CHARS]
    return hashlib.sha1(material.encode("utf-8")).hexdigest()


class RepostIndex:
    """Fleet-wide first owner of each fingerprint, in Redis (``redis.asyncio`` client)."""

    def __init__(self, client: AsyncRedis, keys: KeyLayout, across_sites: bool = False) -> None:
        self.client = client
        self.keys = keys
        self.across_sites = across_sites

    def key(self, site_id: str, fp: str) -> str:
        if self.across_sites:
            return self.keys.content_fingerprint_any(fp)
        return self.keys.content_fingerprint(site_id, fp)

    async def owner(self, site_id: str, fp: str, doc_id: str, window: float) -> str | None:
        """The id of an *other* document that had ``fp`` first within the window, else None
        (``doc_id`` then owns it, or already did: a re-crawl is not a repost)."""
        key = self.key(site_id, fp)
        # SET NX first: one round trip in the common case of a new article.
        if await self.client.set(key, doc_id, nx=True, ex=max(1, int(window))):
            return None
        first = await self.client.get(key)
        if isinstance(first, bytes):
            first = first.decode("utf-8")
        return first if first and first != doc_id else None

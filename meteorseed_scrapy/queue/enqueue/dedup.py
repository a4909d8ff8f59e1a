"""What identifies a request for dedup, which re-crawl window applies to it, and the one server
setting the dedup layer's memory budget depends on (:func:`check_server_config`).

By default a request is its canonical URL (plus method and body when they matter): fast, and
the same in every process. A project that sets Scrapy's ``REQUEST_FINGERPRINTER_CLASS`` (to
ignore a session parameter, say) gets its fingerprints instead, as Scrapy's own dupefilter
would: :func:`project_fingerprinter` picks the one in use and says which at start.

Exact-layer buckets hold up to ~128 entries (mean 40, see ``DD_LOAD`` in dedup_lib.lua) and
rely on Redis keeping such small hashes in its compact listpack (7.x) / ziplist (6.2)
encoding. The defaults (128 entries, 64-byte values) do; a server configured lower still
dedups correctly, but each bucket becomes a real hash table costing ~4x the memory.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import ResponseError

from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings

    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

logger = logging.getLogger(__name__)

#: Exec task ``meta`` key holding the re-crawl window in seconds (a seed's ``recrawl_after``).
RECRAWL_META_KEY = "recrawl_after"
#: Longest accepted window: ten years (the Lua side keys generations by ``now // window``).
MAX_RECRAWL_AFTER = 10 * 365 * 86400


class Fingerprinter(Protocol):
    """Scrapy's request fingerprinter interface (``REQUEST_FINGERPRINTER_CLASS``)."""

    def fingerprint(self, request: Request) -> bytes: ...


def fingerprint_bytes(task: ExecTask, canonical: str | None = None,
                      fingerprinter: Fingerprinter | None = None) -> bytes:
    """16 bytes of SHA-256 identifying ``task`` for dedup (the layout is in dedup_lib.lua).

    A plain GET is identified by its canonical URL alone. Any other method, or a GET that carries
    a body, also hashes the method and the body: a POST search with two different bodies is two
    different requests. ``canonical`` skips re-canonicalising when the caller already did.
    With ``fingerprinter`` (a project's, see :func:`project_fingerprinter`), its fingerprint
    of ``task`` as a Scrapy request decides instead. Raises ``ValueError`` when the URL cannot
    be canonicalised or the project's fingerprinter fails.
    """
    url = canonical if canonical is not None else task.canonical_url
    if fingerprinter is not None:
        return _scrapy_fingerprint(task, fingerprinter)
    method = task.method.upper()
    if method == "GET" and not task.body:
        return url_fingerprint(url)
    return hashlib.sha256(f"{method}\0{url}\0{task.body}".encode()).digest()[:16]


def url_fingerprint(canonical: str) -> bytes:
    """:func:`fingerprint_bytes` of a plain GET (no body) of the ``canonical`` URL."""
    return _sha256(canonical.encode()).digest()[:16]


_sha256 = hashlib.sha256


def _scrapy_fingerprint(task: ExecTask, fingerprinter: Fingerprinter) -> bytes:
    from scrapy import Request

    try:
        request = Request(task.url, method=task.method, headers=dict(task.headers) or None,
                          body=task.body, meta=dict(task.meta))
        raw = fingerprinter.fingerprint(request)
    except Exception as exc:  # the project's code: refuse the task, naming what failed
        raise ValueError(f"REQUEST_FINGERPRINTER_CLASS failed: {exc!r}"[:300]) from exc
    if not isinstance(raw, (bytes, bytearray)) or not raw:
        raise ValueError(f"REQUEST_FINGERPRINTER_CLASS returned {type(raw).__name__}, "
                         "not bytes")
    # Re-hashed to the 16 bytes dedup_lib.lua keeps, tagged so that no project fingerprint can
    # equal a canonical-URL one.
    return hashlib.sha256(b"scrapy-fingerprinter\0" + bytes(raw)).digest()[:16]


def project_fingerprinter(crawler: Crawler) -> Fingerprinter | None:
    """The fingerprinter of the crawler's ``REQUEST_FINGERPRINTER_CLASS`` when the project set
    its own; ``None`` (the canonical-URL default) for Scrapy's. Logs which one dedup uses.

    ``crawler`` may be one that is never started (``seed-expand`` builds one from the project's
    settings): the fingerprinter is then built from it.
    """
    from scrapy.utils.misc import build_from_crawler, load_object
    from scrapy.utils.python import global_object_name
    from scrapy.utils.request import RequestFingerprinter

    cls = load_object(crawler.settings.get("REQUEST_FINGERPRINTER_CLASS"))
    if cls is RequestFingerprinter:
        logger.info("Dedup keys: canonical URLs (REQUEST_FINGERPRINTER_CLASS is Scrapy's default)")
        return None
    try:
        built = crawler.request_fingerprinter
    except (AttributeError, RuntimeError):  # Scrapy 2.15+ raises until the crawl has started
        built = None
    if not isinstance(built, cls):
        built = build_from_crawler(cls, crawler)
    logger.info("Dedup keys: the project's REQUEST_FINGERPRINTER_CLASS %s",
                global_object_name(cls))
    return built


def settings_fingerprinter(settings: Settings | dict[str, Any] | None) -> Fingerprinter | None:
    """:func:`project_fingerprinter` for a command that has settings but no crawler."""
    from scrapy import Spider
    from scrapy.crawler import Crawler

    return project_fingerprinter(Crawler(Spider, settings))


def check_recrawl_after(value: Any, name: str = RECRAWL_META_KEY) -> int:
    """``value`` as a window in whole seconds (0 = never re-crawl), else :class:`TaskError`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TaskError(name, f"must be a whole number of seconds, got {value!r}"[:300])
    if not 0 <= value <= MAX_RECRAWL_AFTER:
        raise TaskError(name, f"must be between 0 and {MAX_RECRAWL_AFTER} seconds")
    return value


def recrawl_window(task: ExecTask) -> str:
    """The window argument of ``enqueue.lua`` for ``task``: its ``meta["recrawl_after"]`` as a
    string, or ``""`` (the site's stored window; child requests carry none)."""
    value = task.meta.get(RECRAWL_META_KEY)
    if value is None:
        return ""
    return str(check_recrawl_after(value, f"meta.{RECRAWL_META_KEY}"))


#: Entries a bucket must be able to hold compactly (DD_LOAD 40, unsplit buckets ~2x, + tail).
NEEDED_ENTRIES = 128
#: Bytes of the longest field or value (6-byte fingerprint prefix, slot number).
NEEDED_VALUE = 8


async def check_server_config(redis: AsyncRedis) -> list[str]:
    """Warnings when Redis would not keep dedup buckets compact (empty when all is well).

    ``hash-max-ziplist-*`` is the 6.2 name and an alias of ``hash-max-listpack-*`` on 7.x, so
    one query works on both.
    """
    try:
        got = await redis.config_get("hash-max-ziplist-*")
    except ResponseError as exc:  # CONFIG disabled on managed Redis: cannot tell
        return [f"cannot read hash-max-ziplist-entries ({exc}); dedup memory assumes >= "
                f"{NEEDED_ENTRIES}"]
    values = {text_of(k, "strict"): text_of(v, "strict") for k, v in got.items()}
    warnings = []
    entries = int(values.get("hash-max-ziplist-entries", NEEDED_ENTRIES))
    value = int(values.get("hash-max-ziplist-value", NEEDED_VALUE))
    if entries < NEEDED_ENTRIES or value < NEEDED_VALUE:
        warnings.append(
            f"Redis hash-max-listpack-entries/value is {entries}/{value} (defaults 128/64): "
            f"URL dedup stays correct but uses several times its memory budget; set at least "
            f"{NEEDED_ENTRIES}/{NEEDED_VALUE}"
        )
    return warnings

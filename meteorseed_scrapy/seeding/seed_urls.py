"""One seed to its exec tasks, one per URL, lazily; a bad URL is data (:class:`UrlError`). What
a seed's payload must be, by its type, is checked first (:func:`check_payload`)."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from meteorseed_scrapy.queue.enqueue.dedup import RECRAWL_META_KEY, check_recrawl_after
from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.seeding.schedule import parse_schedule
from meteorseed_scrapy.seeding.sitemap import SitemapError, check_sitemap_payload, expand_sitemap
from meteorseed_scrapy.seeding.templates import (
    expand_keywords,
    expand_template,
    plan_keywords,
    plan_template,
)
from meteorseed_scrapy.task.canonical import AS_IS_MAX_LEN, AS_IS_URL, canonical_url
from meteorseed_scrapy.task.exec_task import MAX_MESSAGE_BYTES, ExecTask
from meteorseed_scrapy.task.ids import task_ids
from meteorseed_scrapy.task.seed_task import JSON_OPEN, ExecJson, SeedTask
from meteorseed_scrapy.task.validation import TaskError, check_known_keys

#: canonical_url of the URLs just expanded: the check here and the fingerprint in
#: TaskWriter.encoder then canonicalise each URL once (w3lib is the costliest step per URL).
cached_canonical_url = functools.lru_cache(maxsize=4096)(canonical_url)

#: The fields of a seed's payload, by its type (``recrawl_after`` in every one; a compact
#: ``url_list`` in the registry holds ``urls_count`` and ``urls_sha256`` for its list).
PAYLOAD_FIELDS = {
    "url_list": frozenset({"urls", "urls_count", "urls_sha256", RECRAWL_META_KEY}),
    "url_template": frozenset({"template", "params", RECRAWL_META_KEY}),
    "keywords": frozenset({"search_template", "keywords", RECRAWL_META_KEY}),
    "sitemap": frozenset({"url", "lastmod_after", RECRAWL_META_KEY}),
}
_HEX_DIGEST = re.compile(r"[0-9a-f]{0,64}")
#: Most URLs accepted in one ``url_list`` seed line.
MAX_URLS_PER_LINE = 10_000
#: Longest accepted URL, in UTF-8 bytes.
MAX_URL_BYTES = 2048
_LONG_URL = MAX_URL_BYTES // 4  # (a str of at most this many characters is short enough)
_ERRORS = (TaskError, SitemapError)
#: Room for the task id, URL and created_at around a seed's JSON pieces (the fast path needs
#: no size check per URL when they fit in MAX_MESSAGE_BYTES).
_AS_IS_ROOM = 32 + MAX_URL_BYTES + 64
#: Task ids made in one go by the fast path.
_IDS_AT_ONCE = 64


@dataclass(frozen=True)
class UrlError:
    """A bad URL inside a good ``url_list`` line: ``position`` is its 0-based index in
    ``payload.urls``."""

    position: int
    reason: str


def check_payload(seed: SeedTask) -> None:
    """Check the type-specific payload and the ``schedule`` of ``seed``; raises
    :class:`TaskError`."""
    parse_schedule(seed.schedule)
    check_known_keys(seed.payload, PAYLOAD_FIELDS[seed.task_type], "payload",
                     f"a field of a {seed.task_type} payload")
    for where, holder in (("payload", seed.payload), ("meta", seed.meta)):
        if RECRAWL_META_KEY in holder:
            check_recrawl_after(holder[RECRAWL_META_KEY], f"{where}.{RECRAWL_META_KEY}")
    if seed.task_type == "url_template":
        plan_template(seed.payload)
        return
    if seed.task_type == "keywords":
        plan_keywords(seed.payload)
        return
    if seed.task_type == "sitemap":
        check_sitemap_payload(seed.payload)
        return
    urls = seed.payload.get("urls")
    if not isinstance(urls, list):
        raise TaskError("payload.urls", "must be a list of URLs")
    if len(urls) > MAX_URLS_PER_LINE:
        raise TaskError(
            "payload.urls",
            f"has {len(urls)} URLs, more than the limit of {MAX_URLS_PER_LINE} per line",
        )
    _check_let_go(seed.payload)


def _check_let_go(payload: Mapping[str, Any]) -> None:
    """The registry's note of a URL list it let go of (``compact_definition``), typed: stored
    and shown as it is, a NaN there would be JSON no strict reader takes."""
    count = payload.get("urls_count", 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise TaskError("payload.urls_count", f"must be a whole number >= 0, got {count!r}"
                        [:200])
    digest = payload.get("urls_sha256", "")
    if not isinstance(digest, str) or not _HEX_DIGEST.fullmatch(digest):
        raise TaskError("payload.urls_sha256", "must be a hex digest (at most 64 digits 0-9a-f)")


def expand(seed: SeedTask, sitemaps: Callable[[str], FetchPolicy] | None = None
           ) -> Iterator[ExecTask | UrlError]:
    """Exec tasks of ``seed``, one per URL, in order; a bad URL yields a :class:`UrlError`
    whose position counts URLs in expansion order (for ``url_list``: the index in
    ``payload.urls``; ``keywords``: in ``payload.keywords``; a failing child sitemap takes
    the position where its URLs would have been).

    The seed's payload is checked now (raising :class:`TaskError`), the URLs lazily, so a seed
    of a million URLs never exists as a million tasks at once. A sitemap that cannot be read
    raises :class:`SitemapError` while iterating; it is fetched under ``sitemaps(site_id)``
    (the setting and the site's rules), by default under the safe :class:`FetchPolicy`.
    """
    seed, urls = _seed_urls(seed, sitemaps)
    return (item if isinstance(item, UrlError) else item[0] for item in _expand_urls(seed, urls))


def expand_checked(seed: SeedTask, sitemaps: Callable[[str], FetchPolicy] | None = None,
                   as_template: Callable[[ExecTask], bool] | None = None
                   ) -> Iterator[tuple[ExecTask, str, str, str] | UrlError]:
    """:func:`expand` as ``(task, canonical URL, message JSON, URL)``, with what the checks
    computed (:meth:`TaskWriter.encoder
    <meteorseed_scrapy.queue.enqueue.writer.TaskWriter.encoder>` takes them as they are).

    When ``as_template(template)`` is true for the seed's template task (a caller whose
    encoder reads only the seed-level fields of a task), URLs already in canonical form come
    with that one template instead of a task of their own, which spares building an object per
    URL; the JSON, canonical URL and errors stay those of the tasks they stand for.
    """
    seed, urls = _seed_urls(seed, sitemaps)
    parts = seed.exec_json() if as_template is not None else None
    if parts is not None and as_template is not None and as_template(parts.template) and (
            len(parts.head.encode()) + len(parts.tail.encode()) + _AS_IS_ROOM
            <= MAX_MESSAGE_BYTES):
        return _expand_as_is(seed, urls, parts)
    return (_with_url(item) for item in _expand_urls(seed, urls))


def _seed_urls(seed: SeedTask, sitemaps: Callable[[str], FetchPolicy] | None
               ) -> tuple[SeedTask, Iterable[Any]]:
    check_payload(seed)
    if RECRAWL_META_KEY not in seed.meta and RECRAWL_META_KEY in seed.payload:
        # The window travels with each task (tasks.meta) to enqueue.lua, which stores it as
        # the site's window, so child requests (which carry none) inherit it.
        seed = SeedTask(**{**seed.__dict__, "meta": {
            **seed.meta, RECRAWL_META_KEY: seed.payload[RECRAWL_META_KEY]}})
    urls: Iterable[Any]
    if seed.task_type == "url_template":
        urls = expand_template(seed.payload)
    elif seed.task_type == "keywords":
        urls = expand_keywords(seed.payload)
    elif seed.task_type == "sitemap":
        urls = expand_sitemap(seed.payload, sitemaps(seed.site_id) if sitemaps else None)
    else:
        urls = seed.payload["urls"]
    return seed, urls


def _expand_urls(seed: SeedTask, urls: Iterable[Any]
                 ) -> Iterator[tuple[ExecTask, str, str] | UrlError]:
    # Seed-level fields validated once, per URL only the URL (same errors as seed.exec_task).
    make_task = seed.exec_task_factory() or seed.exec_task
    for position, url in enumerate(urls):
        yield _expand_one(make_task, position, url)


def _with_url(item: tuple[ExecTask, str, str] | UrlError
              ) -> tuple[ExecTask, str, str, str] | UrlError:
    """An item of the general way as :func:`expand_checked` gives it (its URL last)."""
    return item if isinstance(item, UrlError) else (*item, item[0].url)


def _expand_one(make_task: Callable[[Any], ExecTask], position: int, url: Any
                ) -> tuple[ExecTask, str, str] | UrlError:
    # Everything that could fail later in TaskWriter.add is checked here, per URL, so one
    # bad URL is rejected alone instead of failing a whole batch.
    if type(url) is str:  # (the common case first: one test per URL)
        if len(url) > _LONG_URL and len(url.encode("utf-8", "replace")) > MAX_URL_BYTES:
            return UrlError(position, f"url: is longer than {MAX_URL_BYTES} bytes")
    elif isinstance(url, _ERRORS):
        return UrlError(position, str(url))
    elif isinstance(url, str) and len(url.encode("utf-8", "replace")) > MAX_URL_BYTES:
        return UrlError(position, f"url: is longer than {MAX_URL_BYTES} bytes")
    try:
        task = make_task(url)  # validates the URL (any JSON value may come in)
        try:
            canonical = cached_canonical_url(task.url)  # a bad port or IPv6 host fails
        except ValueError as exc:
            raise TaskError("url", f"cannot be canonicalised ({exc})") from None
        payload = task.to_message()["t"]  # too large (seed meta + URL), or not encodable
    except ValueError as exc:  # TaskError included
        return UrlError(position, str(exc))
    return task, canonical, payload


def _expand_as_is(seed: SeedTask, urls: Iterable[Any], parts: ExecJson
                  ) -> Iterator[tuple[ExecTask, str, str, str] | UrlError]:
    """expand_checked's fast path: a URL that AS_IS_URL fullmatches is a valid http(s) URL
    (what check_url checks) whose JSON string is itself in quotes, so its task JSON is made
    from the seed's pieces without an ExecTask; its canonical form is usually itself. Any
    other URL (or value) goes the general way, one at a time, with the same errors."""
    template = parts.template
    make_task = seed.exec_task_factory() or seed.exec_task
    fullmatch, head = AS_IS_URL.fullmatch, f'{parts.head}"'
    now, closing, valid_until = time.time, "", 0.0
    ids, at, end = "", 0, 0
    for position, url in enumerate(urls):
        if type(url) is not str or len(url) > MAX_URL_BYTES or fullmatch(url) is None:
            yield _with_url(_expand_one(make_task, position, url))
            continue
        if len(url) <= AS_IS_MAX_LEN and "&" not in url and "/." not in url and (
                "--" not in url):
            canonical = url
        else:
            try:
                canonical = cached_canonical_url(url)
            except ValueError:  # (never seen: the general way words the error)
                yield _with_url(_expand_one(make_task, position, url))
                continue
        # created_at is round(time(), 3) as for each task, the rounding redone only when
        # the time has moved past the value it rounded to.
        t = now()
        if t >= valid_until:
            created_at = round(t, 3)
            closing, valid_until = f'"{parts.closing(created_at)}', created_at + 0.0005
        if at == end:
            ids, at, end = task_ids(_IDS_AT_ONCE), 0, 32 * _IDS_AT_ONCE
        task_id = ids[at:at + 32]
        at += 32
        yield template, canonical, f"{JSON_OPEN}{task_id}{head}{url}{closing}", url


__all__ = ["MAX_URLS_PER_LINE", "MAX_URL_BYTES", "PAYLOAD_FIELDS", "UrlError",
           "cached_canonical_url", "check_payload", "expand", "expand_checked"]

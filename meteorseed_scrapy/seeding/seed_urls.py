"""One seed to its exec tasks, one per URL, lazily; a bad URL is data (:class:`UrlError`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from meteorseed_scrapy.queue.dedup import RECRAWL_META_KEY
from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.seeding.payload import check_payload
from meteorseed_scrapy.seeding.sitemap import SitemapError, expand_sitemap
from meteorseed_scrapy.seeding.templates import expand_keywords, expand_template
from meteorseed_scrapy.task.canonical import canonical_url
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

#: canonical_url of the URLs just expanded: the check here and the fingerprint in
#: TaskWriter.encode then canonicalise each URL once (w3lib is the costliest step per URL).
cached_canonical_url = functools.lru_cache(maxsize=4096)(canonical_url)

#: Longest accepted URL, in UTF-8 bytes.
MAX_URL_BYTES = 2048


@dataclass(frozen=True)
class UrlError:
    """A bad URL inside a good ``url_list`` line: ``position`` is its 0-based index in
    ``payload.urls``."""

    position: int
    reason: str


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


def expand_checked(seed: SeedTask, sitemaps: Callable[[str], FetchPolicy] | None = None
                   ) -> Iterator[tuple[ExecTask, str, str] | UrlError]:
    """:func:`expand`, each task with its canonical URL and its message JSON, which the checks
    computed (:meth:`TaskWriter.seed_encoder
    <meteorseed_scrapy.queue.writer.TaskWriter.seed_encoder>` takes them as they are)."""
    seed, urls = _seed_urls(seed, sitemaps)
    return _expand_urls(seed, urls)


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
    errors, long_url = (TaskError, SitemapError), MAX_URL_BYTES // 4
    for position, url in enumerate(urls):
        # Everything that could fail later in TaskWriter.add is checked here, per URL, so one
        # bad URL is rejected alone instead of failing a whole batch.
        if type(url) is str:  # (the common case first: one test per URL)
            if len(url) > long_url and len(url.encode("utf-8", "replace")) > MAX_URL_BYTES:
                yield UrlError(position, f"url: is longer than {MAX_URL_BYTES} bytes")
                continue
        elif isinstance(url, errors):
            yield UrlError(position, str(url))
            continue
        elif isinstance(url, str) and len(url.encode("utf-8", "replace")) > MAX_URL_BYTES:
            yield UrlError(position, f"url: is longer than {MAX_URL_BYTES} bytes")
            continue
        try:
            task = make_task(url)  # validates the URL (any JSON value may come in)
            try:
                canonical = cached_canonical_url(task.url)  # a bad port or IPv6 host fails
            except ValueError as exc:
                raise TaskError("url", f"cannot be canonicalised ({exc})") from None
            payload = task.to_message()["t"]  # too large (seed meta + URL), or not encodable
        except ValueError as exc:  # TaskError included
            yield UrlError(position, str(exc))
            continue
        yield task, canonical, payload


__all__ = ["MAX_URL_BYTES", "UrlError", "cached_canonical_url", "expand", "expand_checked"]

"""Re-parse cached pages with a site's current rules and upsert what they give, without a
request to the site (``meteorseed sites reparse``; the cache: :mod:`.page_cache`).

Each cached page goes through what its fetch went through after the download: the rule
spider's callback it was parsed with (with the same ``sites_page`` / ``sites_depth`` meta),
then :class:`~.pipeline.SitesPipeline` (anomalies to ``anomalies``, reposts marked or skipped),
then the store stage's own document builder (:func:`~meteorseed_scrapy.store.documents.
item_document`) with the page's task as the scrape: the same ``_id`` (``site_id:unique_key``,
a keyless item keyed by its task's URL and its place on the page), ``first_seen_at`` kept by
the upsert, ``seed_id`` / ``task_id`` of the fetch. Requests the callback yields are counted,
never sent. Redis is needed only for a site whose ``dedup`` is on (the repost index lives
there); it is not connected otherwise.

A cache entry that cannot be read (truncated, corrupted) or a page the rules cannot parse is
counted and named in a warning; the other pages go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scrapy import Request
from scrapy.exceptions import DropItem
from scrapy.http import HtmlResponse, Response, TextResponse

from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.sites.page_cache import CALLBACKS, META_KEYS
from meteorseed_scrapy.sites.pipeline import SiteItem, SitesPipeline
from meteorseed_scrapy.sites.spider import RuleSpider
from meteorseed_scrapy.store.base import Store
from meteorseed_scrapy.store.documents import DocumentError, item_document
from meteorseed_scrapy.store.page_cache import CachedPage, CorruptPage, PageCache, decode
from meteorseed_scrapy.task.context import (
    CURRENT_OUTPUT,
    CURRENT_SCRAPE,
    TASK_META_KEY,
    Output,
    Scrape,
)
from meteorseed_scrapy.task.exec_task import ExecTask

logger = logging.getLogger(__name__)
BATCH = 100
CONCURRENCY = 16  # pages parsed together


@dataclass
class ReparseResult:
    pages: int = 0  # cached pages parsed
    items: int = 0  # documents upserted
    anomalies: int = 0  # items kept in anomalies instead
    reposts_skipped: int = 0
    unreadable: int = 0  # cache entries that could not be read back
    failed: int = 0  # pages the rules could not parse, documents the store refused
    links_not_followed: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)  # the first few, for the operator

    def problem(self, text: str) -> None:
        logger.warning("Reparse: %s", text)
        if len(self.problems) < 20:
            self.problems.append(text[:500])


def page_response(config: SiteConfig, page: CachedPage) -> Response:
    """The response the rule spider parsed, rebuilt from its cache entry (``ValueError``, or
    the task's own error naming the field, when the entry's values cannot make one)."""
    # Only the meta the writer keeps (a shared database's entry could carry any other key).
    meta: dict[str, Any] = {key: page.meta[key] for key in META_KEYS
                            if type(page.meta.get(key)) is int}
    meta["site_id"] = page.site_id
    if page.task:
        meta[TASK_META_KEY] = ExecTask(task_id=page.task["task_id"],
                                       seed_id=page.task["seed_id"], site_id=page.site_id,
                                       url=page.task["url"])
    cls = HtmlResponse if config.format == "html" else TextResponse
    return cls(page.url, status=page.status, headers=page.headers, body=page.body,
               request=Request(page.url, meta=meta))


class Reparser:
    def __init__(self, spider: RuleSpider, cache: PageCache, store: Store,
                 pipeline: SitesPipeline) -> None:
        self.spider = spider
        self.cache = cache
        self.store = store
        self.pipeline = pipeline

    async def run(self, site_id: str, since: str,
                  progress: Callable[[ReparseResult], None] | None = None) -> ReparseResult:
        config = self.spider.registry.get(site_id)
        if config is None:
            raise LookupError(f"no valid rules for site {site_id!r}")
        result = ReparseResult()
        started = time.perf_counter()
        docs: list[dict[str, Any]] = []
        window: list[tuple[CachedPage, Response]] = []
        for entry in self.cache.pages(site_id, since):
            try:
                page = decode(entry.data)
                if page.callback not in CALLBACKS:
                    raise CorruptPage(f"callback {page.callback!r} is not the rule spider's")
                window.append((page, page_response(config, page)))
            except (CorruptPage, ValueError, KeyError, TypeError) as exc:
                result.unreadable += 1
                result.problem(f"cache entry {entry.key} (fetched {entry.fetched_at}) cannot be"
                               f" read: {exc}")
                continue
            if len(window) >= CONCURRENCY:
                docs += await self._pages(config, window, result)
            if len(docs) >= BATCH:
                self._flush(docs, result)
                if progress is not None:
                    progress(result)
        docs += await self._pages(config, window, result)
        self._flush(docs, result)
        result.seconds = time.perf_counter() - started
        return result

    async def _pages(self, config: SiteConfig, window: list[tuple[CachedPage, Response]],
                     result: ReparseResult) -> list[dict[str, Any]]:
        """The documents of a window of pages, handled together (their repost checks' Redis
        round trips overlap), in the pages' order (a later page's document wins)."""
        done = await asyncio.gather(*(self._page(config, page, response, result)
                                      for page, response in window))
        window.clear()
        return [doc for docs in done for doc in docs]

    async def _page(self, config: SiteConfig, page: CachedPage, response: Response,
                    result: ReparseResult) -> list[dict[str, Any]]:
        try:
            output = list(getattr(self.spider, page.callback)(response))
        except Exception as exc:  # e.g. a json site's page that is not JSON
            result.failed += 1
            result.problem(f"{page.url}: not parsed: {type(exc).__name__}: {exc}")
            return []
        result.pages += 1
        task = response.meta.get(TASK_META_KEY)
        scrape = Scrape(task) if isinstance(task, ExecTask) else None
        docs: list[dict[str, Any]] = []
        for value in output:
            if not isinstance(value, SiteItem):
                result.links_not_followed += 1
                continue
            place = Output(scrape, value) if scrape is not None else None
            tokens = (CURRENT_SCRAPE.set(scrape), CURRENT_OUTPUT.set(place))
            try:
                out = await self.pipeline.process_item(value)
                doc, _ = item_document(out, scrape, page.site_id, place)
            except DropItem:
                if value.reasons:
                    result.anomalies += 1
                else:
                    result.reposts_skipped += 1
                continue
            except DocumentError as exc:
                result.failed += 1
                result.problem(f"{page.url}: item not stored: {exc}")
                continue
            finally:
                CURRENT_OUTPUT.reset(tokens[1])
                CURRENT_SCRAPE.reset(tokens[0])
            docs.append(doc)
        return docs

    def _flush(self, docs: list[dict[str, Any]], result: ReparseResult) -> None:
        if docs:
            self.store.upsert_many(docs)
            result.items += len(docs)
            docs.clear()

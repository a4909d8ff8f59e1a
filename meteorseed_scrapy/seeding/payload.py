"""The type-specific checks of a seed: its payload, its ``schedule`` and its recrawl window."""

from __future__ import annotations

from meteorseed_scrapy.queue.enqueue.dedup import RECRAWL_META_KEY, check_recrawl_after
from meteorseed_scrapy.seeding.schedule import parse_schedule
from meteorseed_scrapy.seeding.sitemap import check_sitemap_payload
from meteorseed_scrapy.seeding.templates import plan_keywords, plan_template
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

#: Most URLs accepted in one ``url_list`` seed line.
MAX_URLS_PER_LINE = 10_000


def check_payload(seed: SeedTask) -> None:
    """Check the type-specific payload and the ``schedule`` of ``seed``; raises
    :class:`TaskError`."""
    parse_schedule(seed.schedule)
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


__all__ = ["MAX_URLS_PER_LINE", "check_payload"]

"""``meteorseed sites reparse SITE [--since T]``: the site's current rules over its cached
pages, the results upserted, no request sent (:mod:`meteorseed_scrapy.sites.reparse`).

Rules come from files (``--sites-dir``, else ``METEORSEED_SITES_DIR``), as for ``sites try``;
the store and the page cache from the settings a worker reads (``METEORSEED_STORE_URI``,
``METEORSEED_PAGE_CACHE_URI``, ``METEORSEED_NAMESPACE``; the options first). ``--since`` is a
duration back from now (``2h``, ``1d``) or an ISO-8601 time (``2026-12-04T10:00:00Z``; without
an offset, UTC). Exit 1 when a cache entry could not be read, a page not parsed or no page was
cached for the site.
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Any

from meteorseed_scrapy.cli.common import CliError, cli_settings
from meteorseed_scrapy.cli.site_try import offline_context, site_rules
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import (
    flag_setting,
    redis_url_from,
    store_uri_from,
    text_setting,
)
from meteorseed_scrapy.validators import ConfigError, parse_duration


def register(actions: Any) -> None:
    p = actions.add_parser("reparse", help="run a site's current rules over its cached pages"
                           " and upsert the results; no request to the site")
    p.add_argument("site_id", metavar="SITE")
    p.add_argument("--since", default=None, metavar="T",
                   help="only pages fetched since T: a duration back (2h, 1d) or an ISO-8601"
                        " time (default: every cached page)")
    p.add_argument("--sites-dir", type=Path, help="rule files (default: env"
                   " METEORSEED_SITES_DIR, else the Scrapy project's setting)")
    p.add_argument("--store-uri", help="the store (default: METEORSEED_STORE_URI)")
    p.add_argument("--namespace", help="default: METEORSEED_NAMESPACE")
    p.add_argument("--redis-url", help="for sites with content dedup only (default:"
                   " METEORSEED_REDIS_URL)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run_offline=run_reparse)


def parse_since(text: str | None, now: datetime | None = None) -> str:
    """The earliest ``fetched_at`` to re-parse (a
    :func:`~meteorseed_scrapy.store.documents.utc_timestamp`), or :class:`CliError` naming
    ``--since``."""
    from meteorseed_scrapy.store.documents import utc_timestamp

    if text is None:
        return ""
    now = now or datetime.now(timezone.utc)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        try:
            back = parse_duration(text, "--since", positive=True)
            return utc_timestamp(now - timedelta(seconds=back))
        except (ConfigError, OverflowError):
            raise CliError(f"--since: expected a duration back from now (2h, 1d) or an"
                           f" ISO-8601 time, got {text[:100]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    try:
        moment = moment.astimezone(timezone.utc)
    except OverflowError:  # (0001-01-01T00:00+01:00 is no time in UTC)
        raise CliError(f"--since: {text[:100]!r} is out of range in UTC") from None
    # Before any page was fetched: every page (and a year below 1000 would not sort as text).
    return utc_timestamp(moment) if moment.year >= 1970 else ""


def run_reparse(args: argparse.Namespace, out: IO[str], err: IO[str], stdin: IO[str]) -> int:
    ctx = offline_context(args, out, err, stdin)
    since = parse_since(args.since)
    settings = cli_settings()
    namespace = args.namespace or text_setting(settings, "METEORSEED_NAMESPACE")
    try:
        keys = KeyLayout(namespace)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    store_uri = args.store_uri or store_uri_from(settings)
    cache_uri = text_setting(settings, "METEORSEED_PAGE_CACHE_URI") or store_uri
    config, path = site_rules(args.sites_dir, args.site_id)
    # Imported here: the spider brings Twisted, which `meteorseed status` need not load.
    from meteorseed_scrapy.sites.loader import SiteRegistry
    from meteorseed_scrapy.sites.pipeline import SitesPipeline
    from meteorseed_scrapy.sites.reparse import Reparser, ReparseResult
    from meteorseed_scrapy.sites.rulefile import FileResult
    from meteorseed_scrapy.sites.spider import RuleSpider
    from meteorseed_scrapy.store.backends import open_store
    from meteorseed_scrapy.store.page_cache import open_page_cache

    registry = SiteRegistry(None)
    registry.apply([FileResult(path, (0, 0), config=config)])
    spider = RuleSpider(registry=registry, reload_interval=0)
    try:
        cache = open_page_cache(cache_uri, namespace)
        store = open_store(store_uri, namespace)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    pipeline = SitesPipeline(store_uri, args.redis_url or redis_url_from(settings), keys,
                             across_sites=flag_setting(settings,
                                                       "METEORSEED_REPOSTS_ACROSS_SITES"))

    async def run() -> ReparseResult:
        try:
            return await Reparser(spider, cache, store, pipeline).run(config.site_id, since)
        finally:
            await pipeline.close_spider()

    try:
        result = asyncio.run(run())
    except Exception as exc:  # the store or the cache unreachable, Redis down for dedup
        raise CliError(f"reparse of site {config.site_id} stopped: {type(exc).__name__}:"
                       f" {str(exc)[:300]}") from None
    finally:
        cache.close()
        store.close()
    rate = result.pages / result.seconds if result.seconds > 0 else 0.0
    if ctx.json:
        ctx.emit_json({"site_id": config.site_id, "version": config.version,
                       "since": since or None, "pages": result.pages, "items": result.items,
                       "anomalies": result.anomalies, "reposts_skipped": result.reposts_skipped,
                       "unreadable": result.unreadable, "failed": result.failed,
                       "links_not_followed": result.links_not_followed,
                       "requests_sent": 0, "seconds": round(result.seconds, 3),
                       "pages_per_second": round(rate, 1), "problems": result.problems})
    else:
        ctx.say(f"site {config.site_id} rule version {config.version}: re-parsed"
                f" {result.pages} cached pages in {result.seconds:.2f} s ({rate:.0f} pages/s),"
                f" 0 requests sent")
        ctx.say(f"{result.items} documents upserted, {result.anomalies} anomalies,"
                f" {result.reposts_skipped} reposts skipped, {result.links_not_followed}"
                f" links not followed")
        if result.unreadable or result.failed:
            ctx.say(f"{result.unreadable} cache entries unreadable, {result.failed} failed:")
            for problem in result.problems:
                ctx.say(f"  {problem}")
        if not result.pages and not result.unreadable:
            ctx.say(f"no cached page of site {config.site_id}"
                    + (f" since {since}" if since else "")
                    + " (the cache is filled by workers with METEORSEED_PAGE_CACHE = True)")
    bad = result.unreadable or result.failed or not result.pages
    return EXIT_INCOMPLETE if bad else EXIT_OK

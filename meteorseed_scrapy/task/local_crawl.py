"""Which crawls and requests are not work of the stream: crawled locally, never put in Redis.

Scrapy's own commands build requests that are no task of any seed. They run as stock Scrapy
runs them, and the rule is here, in one place:

* **A whole crawl is local** when its spider's ``start()`` comes from a module of
  ``scrapy.commands`` (``fetch`` and ``view`` replace it with one request, ``parse`` with the
  URL given, ``check`` with the contracts' requests; ``bench`` crawls its own spider), or when
  Scrapy's shell drives the engine: the shell opens the spider with
  ``open_spider_async(close_if_idle=False)`` on a crawler that was never started with
  ``crawl()``, which nothing else in Scrapy does. Such a crawl never connects to Redis: a look
  at a page must not claim the fleet's tasks. The store stage switches itself off in the
  commands' crawls (``check`` and ``parse --pipelines`` would store items); the shell's is
  built before the shell is known, and no item reaches it (its ``fetch()`` keeps the response).
* **In a worker crawl, a request is local** when it carries no task, was not yielded by a task's
  callback (no scrape is current) and is not a start request (``meta["is_start_request"]``, set
  by Scrapy's ``StartSpiderMiddleware``, on by default; without it start requests would be
  local too): an ``engine.crawl()`` from outside any scrape, such as a ``spider_idle``
  handler's or an extension's. It is marked
  (:data:`LOCAL_META_KEY`) so that its retries and redirects, whose meta Scrapy copies, stay
  local too, and so do the requests its own callback yields (no scrape is current there).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy import Request

from meteorseed_scrapy.scrapy_internals import opened_by_hand
from meteorseed_scrapy.task.context import Scrape, task_of

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: the package whose modules define the ``start()`` of Scrapy's commands' crawls
COMMANDS_PACKAGE = "scrapy.commands"
#: meta key of a request crawled locally in a worker crawl (kept by its retries and redirects)
LOCAL_META_KEY = "meteorseed_local"


def command_of(spidercls: type[Spider] | None) -> str | None:
    """The Scrapy command (``fetch``, ``parse``, ``check``, ``bench``...) whose ``start()``
    this spider class runs, or None for a crawl of the spider's own ``start()``."""
    module = getattr(getattr(spidercls, "start", None), "__module__", None)
    if isinstance(module, str) and module.startswith(COMMANDS_PACKAGE + "."):
        return module[len(COMMANDS_PACKAGE) + 1:]
    return None


def driven_by_shell(crawler: Crawler) -> bool:
    """Whether Scrapy's shell opened this crawler's spider: it opens it by hand, with
    ``close_if_idle=False``, on a crawler whose ``crawl()`` never ran. Known once the engine
    opens its spider (the scheduler's ``open``), not before."""
    return opened_by_hand(crawler)


def local_crawl(crawler: Crawler) -> str | None:
    """Why this whole crawl is local (a sentence for the log), or None for a worker crawl."""
    command = command_of(getattr(crawler, "spidercls", None))
    if command is not None:
        return f"its spider's start() is Scrapy's `{command}` command's"
    if driven_by_shell(crawler):
        return "Scrapy's shell drives it"
    return None


def local_request(request: Request, scrape: Scrape | None) -> bool:
    """In a worker crawl: whether ``request``, enqueued while ``scrape`` is current, is local
    (marked so, when it is). A request carrying a task never is."""
    if task_of(request) is not None:
        return False
    if request.meta.get(LOCAL_META_KEY):
        return True
    if scrape is not None or request.meta.get("is_start_request"):
        return False
    request.meta[LOCAL_META_KEY] = True
    return True


def log_local_crawl(reason: str) -> None:
    logger.info("Local crawl: %s. Its requests are crawled as by Scrapy's own scheduler; "
                "nothing is read from or written to Redis, and no item is stored", reason)


__all__ = ["COMMANDS_PACKAGE", "LOCAL_META_KEY", "command_of", "driven_by_shell",
           "local_crawl", "local_request", "log_local_crawl"]

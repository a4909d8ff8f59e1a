"""Every ``METEORSEED_*`` value checked at once, before anything is built from it.

Each component reads its settings when it is built, and an invalid value stops it naming the
setting; in a worker that happens while Scrapy's engine is half-built (the scheduler comes
after the downloader), which then fails closing and buries the line in a traceback
(scrapy#8169). :func:`check_settings` reads each value through the same builders the
components use, so the add-on, ``scrapy seed-expand`` and ``meteorseed`` refuse an invalid
value up front, with one line, and the rules live in one place per setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meteorseed_scrapy.exit_codes import EXIT_ERROR
from meteorseed_scrapy.observability.metrics import SETTING as METRICS_PORT
from meteorseed_scrapy.observability.metrics import port_range
from meteorseed_scrapy.observability.notify import NotifyConfig
from meteorseed_scrapy.politeness.breaker import BreakerConfig
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.queue.consume.lanes import LaneWeights
from meteorseed_scrapy.queue.consume.retention import DeadLetterRetention
from meteorseed_scrapy.queue.consume.task_history import TaskHistory
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.runner import bounds_from
from meteorseed_scrapy.settings import (
    StoreConfig,
    WorkerConfig,
    duration_setting,
    flag_setting,
    integer_setting,
    redis_url_from,
    retry_http_codes,
    scrapy_count,
    setting,
)
from meteorseed_scrapy.sites.page_cache import PageCacheConfig
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.interpreter import InterpreterTuning
from meteorseed_scrapy.worker.work_budget import max_settling

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: Settings that are text of any kind: nothing to check.
TEXT = frozenset({
    "METEORSEED_REDIS_URL", "METEORSEED_STORE_URI", "METEORSEED_CONSUMER",
    "METEORSEED_SITES_DIR", "METEORSEED_METRICS_HOST", "METEORSEED_CHROMIUM_PATH",
    "METEORSEED_PAGE_CACHE_URI",
    "METEORSEED_NOTIFY_SECRET",
})
#: Scrapy's own settings that the add-on's components read as whole numbers >= 0 (the
#: retries, the redirects, the download capacity), through
#: :func:`~meteorseed_scrapy.settings.scrapy_count`: refused here up front, naming the setting,
#: where they would fail later, inside a half-built engine. (A worker crawl also refuses a
#: ``CONCURRENT_REQUESTS`` of 0 when it opens:
#: :class:`~meteorseed_scrapy.worker.work_budget.WorkSizes`.)
SCRAPY_COUNTS = ("RETRY_TIMES", "REDIRECT_MAX_TIMES", "CONCURRENT_REQUESTS")
FLAGS = ("METEORSEED_POLITENESS", "METEORSEED_SITES_REDIS", "METEORSEED_LOG_JSON",
         "METEORSEED_FETCH_PRIVATE_ADDRESSES", "METEORSEED_PAGE_CACHE",
         "METEORSEED_REPOSTS_ACROSS_SITES")


class InvalidSettings(ConfigError, SystemExit):
    """An invalid value that ends the process: a :class:`ConfigError` to code that catches
    one, and a ``SystemExit`` (code :data:`EXIT_ERROR`, no traceback) to Scrapy's command line,
    whose asyncio crawler process lets a ``SystemExit`` out of the crawl as it is."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(name, problem)
        self.code = EXIT_ERROR


def check_settings(settings: BaseSettings) -> None:
    """Raise :class:`ConfigError` naming the first invalid ``METEORSEED_*`` value of Scrapy
    ``settings`` (the environment included, as every reader sees it), or the first invalid
    value of a Scrapy setting the add-on reads (:data:`SCRAPY_COUNTS`, ``RETRY_HTTP_CODES``,
    ``CONCURRENT_REQUESTS``)."""
    WorkerConfig.from_settings(settings)
    StoreConfig.from_settings(settings)
    redis_url_from(settings)
    KeyLayout.from_settings(settings)
    SiteLimits.from_settings(settings)
    Backoff.from_settings(settings)
    BreakerConfig.from_settings(settings)
    DeadLetterRetention.from_settings(settings)
    TaskHistory.settings_of(settings)
    LaneWeights.from_settings(settings)
    InterpreterTuning.from_settings(settings)
    max_settling(settings)
    PageCacheConfig.from_settings(settings)
    NotifyConfig.from_settings(settings)
    try:
        bounds_from(lambda name: setting(settings, name))
    except ConfigError:
        raise
    except ValueError as exc:  # the two bounds together (the message names both)
        raise ConfigError("METEORSEED_SCHEDULE_MIN_INTERVAL", str(exc)) from None
    for name in FLAGS:
        flag_setting(settings, name)
    for name in SCRAPY_COUNTS:
        scrapy_count(settings, name)
    retry_http_codes(settings)
    port_range(setting(settings, METRICS_PORT))
    for name in ("METEORSEED_METRICS_INTERVAL", "METEORSEED_PROXY_COOLDOWN",
                 "METEORSEED_SITES_RELOAD_INTERVAL", "METEORSEED_CONSUMER_PRUNE_IDLE"):
        duration_setting(settings, name)
    integer_setting(settings, "METEORSEED_PROXY_MAX_FAILURES", minimum=1)
    integer_setting(settings, "METEORSEED_METRICS_SITES", minimum=0)
    integer_setting(settings, "METEORSEED_MAX_BACKLOG", minimum=0)
    integer_setting(settings, "METEORSEED_ROBOTSTXT_MAXSIZE", minimum=1)
    integer_setting(settings, "METEORSEED_MAX_LINKS_PER_PAGE", minimum=1)
    integer_setting(settings, "METEORSEED_MAX_CHILDREN_PER_TASK", minimum=1)
    for name in ("METEORSEED_MAX_RESPONSE_HEADERS", "METEORSEED_RESPONSE_HEADERS_MAXSIZE"):
        integer_setting(settings, name, minimum=0)  # (0: no cap)


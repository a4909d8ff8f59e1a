"""One line in ``ADDONS`` turns a Scrapy project into a MeteorSeed worker."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, NoReturn

from scrapy.utils.misc import load_object

from meteorseed_scrapy.components import add_component, switch_off
from meteorseed_scrapy.header_cap import set_handlers
from meteorseed_scrapy.politeness.local_limits import local_limits_warning
from meteorseed_scrapy.setting_checks import InvalidSettings, check_settings
from meteorseed_scrapy.settings import (
    DEFAULTS,
    SCRAPY_DEFAULTS,
    apply_environment,
    flag_setting,
    text_setting,
    warn_unknown_settings,
)
from meteorseed_scrapy.validators import ConfigError, to_flag

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

SCHEDULER = "meteorseed_scrapy.scheduler.StreamScheduler"
PIPELINE = "meteorseed_scrapy.pipelines.UpsertPipeline"
SLOT_MIDDLEWARE = "meteorseed_scrapy.middlewares.SiteSlotMiddleware"
# Runs before Scrapy's RetryMiddleware (550) sees a response or an exception.
BACKOFF_MIDDLEWARE = "meteorseed_scrapy.middlewares.BackoffMiddleware"
# Sees every raw outcome before the backoff middleware turns failures into deferrals.
BREAKER_MIDDLEWARE = "meteorseed_scrapy.middlewares.CircuitBreakerMiddleware"
# Feeds each response's latency to its site's fleet-wide adaptive limit (politeness/adaptive.py).
ADAPTIVE_MIDDLEWARE = "meteorseed_scrapy.middlewares.AdaptiveThrottleMiddleware"
# Drops a task's requests over METEORSEED_MAX_CHILDREN_PER_TASK nearest the spider, before any
# other spider middleware handles them (worker/children_cap.py).
CHILDREN_CAP_MIDDLEWARE = "meteorseed_scrapy.worker.children_cap.ChildrenCapMiddleware"
CHILDREN_CAP_ORDER = 10_000
TRACING_EXTENSION = "meteorseed_scrapy.observability.logging.TracingExtension"
# Stays off (NotConfigured) unless METEORSEED_METRICS_PORT is set.
METRICS_EXTENSION = "meteorseed_scrapy.observability.metrics.MetricsExtension"
# Installs the tracing filter (and JSON formatter) on the handler Scrapy re-creates after the
# extensions are built, then disables itself.
LOG_SETUP = "meteorseed_scrapy.middlewares.LogSetupMiddleware"
# Per-site hygiene (defined in politeness/; every downloader middleware is registered by its one
# documented path, meteorseed_scrapy.middlewares): around Scrapy's RobotsTxtMiddleware (100),
# UserAgentMiddleware (400) and HttpProxyMiddleware (750).
HYGIENE_MIDDLEWARES = {
    # API tasks and their redirects from public addresses only, before anything is fetched
    # for them (robots.txt, cookie warm-up): docs/robustness.md
    "meteorseed_scrapy.middlewares.AddressPolicyMiddleware": 55,
    "meteorseed_scrapy.middlewares.BlacklistMiddleware": 60,
    "meteorseed_scrapy.middlewares.CookieWarmupMiddleware": 90,
    # Scrapy's, with concurrent first requests to a host all checked (see its docstring): it
    # takes Scrapy's place (add_component), at 100 unless the project placed Scrapy's.
    "meteorseed_scrapy.middlewares.RobotsTxtMiddleware": 100,
    "meteorseed_scrapy.middlewares.UserAgentPoolMiddleware": 390,
    "meteorseed_scrapy.middlewares.ProxyPoolMiddleware": 740,
}
# Scrapy's periodic stats log (off in Scrapy by default): a worker with METEORSEED_IDLE_CLOSE = 0
# never closes, so its stats would never be dumped. Every LOGSTATS_INTERVAL (60 s) it logs these
# counters, and how much each moved since the last line. A project's PERIODIC_LOG_* settings (or
# -s, or LOGSTATS_INTERVAL = 0) win: the add-on sets them at "addon" priority.
PERIODIC_LOG = "scrapy.extensions.periodic_log.PeriodicLog"
PERIODIC_LOG_INCLUDE = (
    "meteorseed/", "item_scraped_count", "item_dropped_count", "response_received_count",
    "downloader/response_status_count/", "log_count/ERROR",
)
# Scrapy (2.13+, asyncio reactor) starts CONCURRENT_ITEMS asyncio tasks for every response's
# output, however few items it yields: at Scrapy's 100, a tenth of a busy worker's CPU. The
# store stage commits the items waiting together in one batch whatever their number, so 16 lose
# nothing on a one-item page (measured: 1.07x -> 1.33x stock Scrapy's throughput,
# benchmarks/throughput.py) and a 100-item page takes 7 batches instead of 1.
CONCURRENT_ITEMS = 16
#: The generic rule spider (``scrapy crawl sites``).
SITES_SPIDER_MODULE = "meteorseed_scrapy.sites.spider"
#: Warnings said once per process (several crawlers may share one).
_SAID: set[str] = set()
SCRAPY_ROBOTS = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"
# Retries are durable (BackoffMiddleware puts the task in the delayed set in Redis), deciding
# each with Scrapy's own get_retry_request: Scrapy's in-memory RetryMiddleware is off by its
# place in DOWNLOADER_MIDDLEWARES, so RETRY_ENABLED, RETRY_TIMES… keep their meaning.
SCRAPY_RETRY = "scrapy.downloadermiddlewares.retry.RetryMiddleware"
OUR_ROBOTS = "meteorseed_scrapy.middlewares.RobotsTxtMiddleware"


def add_ours(settings: BaseSettings, name: str, path: str, order: int) -> None:
    """:func:`~meteorseed_scrapy.components.add_component`, except that our robots.txt
    middleware takes the place of Scrapy's, at the order the project gave Scrapy's, else
    ``order``; Scrapy's is then off."""
    if path == OUR_ROBOTS:
        component, scrapy_robots = load_object(path), load_object(SCRAPY_ROBOTS)
        orders = {load_object(key): value for key, value in settings.getdict(name).items()}
        if orders.get(scrapy_robots) is not None and component not in orders:
            settings.replace_in_component_priority_dict(name, scrapy_robots, component)
        switch_off(settings, name, SCRAPY_ROBOTS)
    add_component(settings, name, path, order)


def refuse(settings: BaseSettings, error: ConfigError) -> NoReturn:
    """End the crawl on an invalid value: one line (in the log, and on stderr when the log
    goes to a file), then :class:`InvalidSettings`, which Scrapy's command line lets out as
    exit code 2 without a traceback, before the engine is built."""
    logger.error("Invalid setting, the crawl cannot start: %s", error)
    if settings.get("LOG_FILE") or not settings.getbool("LOG_ENABLED"):
        print(f"Invalid setting, the crawl cannot start: {error}", file=sys.stderr)
    raise InvalidSettings(error.name, error.problem) from None


class MeteorSeedAddon:
    """``ADDONS = {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}``.

    Sets the scheduler, the upsert pipeline (last stage, 900) and the downloader middlewares
    (a priority the project gives one of them itself wins), the ``METEORSEED_*`` defaults and
    the environment's ``METEORSEED_*`` values (the project's settings.py < the environment <
    ``-s``). Then it warns about misspelt ``METEORSEED_*`` names and refuses an invalid value
    before anything is built, with one line and exit code 2.
    """

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MeteorSeedAddon:
        return cls()

    @classmethod
    def update_pre_crawler_settings(cls, settings: BaseSettings) -> None:
        """``scrapy crawl sites`` without listing the generic rule spider: when the project
        has rule sites (``METEORSEED_SITES_DIR``, or ``METEORSEED_SITES_REDIS``), its module
        goes first in ``SPIDER_MODULES``, so that a project spider named ``sites`` still wins.
        Scrapy builds its spider loader from these settings, before any crawler."""
        modules = settings.getlist("SPIDER_MODULES")
        if SITES_SPIDER_MODULE in modules:
            return
        try:
            wanted = bool(text_setting(settings, "METEORSEED_SITES_DIR")) \
                or flag_setting(settings, "METEORSEED_SITES_REDIS")
        except ConfigError:  # refused with one line once the crawler applies the settings
            return
        if wanted:
            settings.set("SPIDER_MODULES", [SITES_SPIDER_MODULE, *modules],
                         priority=settings.getpriority("SPIDER_MODULES") or "addon")

    def update_settings(self, settings: BaseSettings) -> None:
        # METEORSEED_* environment variables, between settings.py and -s, as everywhere.
        apply_environment(settings)
        settings.set("SCHEDULER", SCHEDULER, priority="addon")
        components = {
            "ITEM_PIPELINES": {PIPELINE: 900},
            "SPIDER_MIDDLEWARES": {CHILDREN_CAP_MIDDLEWARE: CHILDREN_CAP_ORDER},
            "DOWNLOADER_MIDDLEWARES": {
                LOG_SETUP: 0, SLOT_MIDDLEWARE: 50, BACKOFF_MIDDLEWARE: 580,
                BREAKER_MIDDLEWARE: 585, ADAPTIVE_MIDDLEWARE: 590, **HYGIENE_MIDDLEWARES},
            "EXTENSIONS": {TRACING_EXTENSION: 0, METRICS_EXTENSION: 500, PERIODIC_LOG: 0},
        }
        for setting_name, entries in components.items():
            for path, order in entries.items():
                add_ours(settings, setting_name, path, order)
        # robots.txt is obeyed unless the project (or -s) says otherwise.
        settings.set("ROBOTSTXT_OBEY", True, priority="addon")
        # Unless the project lists it itself (then its in-memory retries come on top).
        switch_off(settings, "DOWNLOADER_MIDDLEWARES", SCRAPY_RETRY)
        settings.set("CONCURRENT_ITEMS", CONCURRENT_ITEMS, priority="addon")
        for name, value in SCRAPY_DEFAULTS.items():  # response size caps (docs/robustness.md)
            settings.set(name, value, priority="addon")
        set_handlers(settings)  # http(s) with the response head capped, unless the project's
        for name in ("PERIODIC_LOG_STATS", "PERIODIC_LOG_DELTA"):
            settings.set(name, {"include": list(PERIODIC_LOG_INCLUDE)}, priority="addon")
        for name, value in DEFAULTS.items():
            settings.set(name, value, priority="default")
        warn_unknown_settings(settings, logger.warning)
        try:
            self._fleet_autothrottle(settings)
            check_settings(settings)
            held_back = local_limits_warning(settings)
        except ConfigError as exc:
            refuse(settings, exc)
        if held_back and held_back not in _SAID:
            _SAID.add(held_back)
            logger.warning("%s", held_back)

    @staticmethod
    def _fleet_autothrottle(settings: BaseSettings) -> None:
        """``AUTOTHROTTLE_ENABLED`` means the fleet-wide adaptive limit here: Scrapy's
        per-process AutoThrottle is switched off (N workers would each aim at the target, N
        times the load asked for) and ``METEORSEED_ADAPTIVE`` on, at the priority the project
        (or ``-s``) gave it. Without fleet-wide politeness there is nothing to hand over to, and
        a project that sets ``METEORSEED_ADAPTIVE = False`` itself keeps Scrapy's."""
        if not to_flag(settings.get("AUTOTHROTTLE_ENABLED"), "AUTOTHROTTLE_ENABLED"):
            return
        for name in ("METEORSEED_POLITENESS", "METEORSEED_ADAPTIVE"):
            value = settings.get(name)
            if (settings.getpriority(name) or 0) > 0 and value not in (None, "") \
                    and not to_flag(value, name):
                return
        # (None only for a name absent from Scrapy's defaults)
        priority = settings.getpriority("AUTOTHROTTLE_ENABLED") or 0
        settings.set("AUTOTHROTTLE_ENABLED", False, priority=priority)
        settings.set("METEORSEED_ADAPTIVE", True, priority=priority)
        logger.info("AUTOTHROTTLE_ENABLED: Scrapy's per-process AutoThrottle is off; each "
                    "site's rate follows the latency the whole fleet observes instead, aiming at "
                    "%s requests in flight in total (METEORSEED_ADAPTIVE)",
                    settings.get("AUTOTHROTTLE_TARGET_CONCURRENCY"))

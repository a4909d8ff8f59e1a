"""One line in ``ADDONS`` turns a Scrapy project into a MeteorSeed worker."""

from __future__ import annotations

from typing import Any

from meteorseed_scrapy.settings import DEFAULTS

SCHEDULER = "meteorseed_scrapy.scheduler.StreamScheduler"
PIPELINE = "meteorseed_scrapy.pipelines.UpsertPipeline"
SLOT_MIDDLEWARE = "meteorseed_scrapy.middlewares.SiteSlotMiddleware"
# Runs before Scrapy's RetryMiddleware (550) sees a response or an exception.
BACKOFF_MIDDLEWARE = "meteorseed_scrapy.middlewares.BackoffMiddleware"
# Sees every raw outcome before the backoff middleware turns failures into deferrals.
BREAKER_MIDDLEWARE = "meteorseed_scrapy.middlewares.CircuitBreakerMiddleware"
TRACING_EXTENSION = "meteorseed_scrapy.observability.logging.TracingExtension"
# Stays off (NotConfigured) unless METEORSEED_METRICS_PORT is set.
METRICS_EXTENSION = "meteorseed_scrapy.observability.metrics.MetricsExtension"
# Installs the tracing filter (and JSON formatter) on the handler Scrapy re-creates after the
# extensions are built, then disables itself.
LOG_SETUP = "meteorseed_scrapy.observability.logging.LogSetupMiddleware"
# Per-site hygiene (meteorseed_scrapy.middlewares): around Scrapy's RobotsTxtMiddleware
# (100), UserAgentMiddleware (400) and HttpProxyMiddleware (750).
HYGIENE_MIDDLEWARES = {
    "meteorseed_scrapy.middlewares.BlacklistMiddleware": 60,
    "meteorseed_scrapy.middlewares.CookieWarmupMiddleware": 90,
    # Scrapy's, with concurrent first requests to a host all checked (see its docstring).
    "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
    "meteorseed_scrapy.middlewares.RobotsTxtMiddleware": 100,
    "meteorseed_scrapy.middlewares.UserAgentPoolMiddleware": 390,
    "meteorseed_scrapy.middlewares.ProxyPoolMiddleware": 740,
}


class MeteorSeedAddon:
    """``ADDONS = {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}``.

    Sets the scheduler, the upsert pipeline (last stage, 900) and the downloader middlewares,
    and the ``METEORSEED_*`` defaults (project settings and ``-s`` still win).
    """

    @classmethod
    def from_crawler(cls, crawler: Any) -> MeteorSeedAddon:
        return cls()

    def update_settings(self, settings: Any) -> None:
        settings.set("SCHEDULER", SCHEDULER, priority="addon")
        settings["ITEM_PIPELINES"][PIPELINE] = 900
        settings["DOWNLOADER_MIDDLEWARES"][SLOT_MIDDLEWARE] = 50
        settings["DOWNLOADER_MIDDLEWARES"][BREAKER_MIDDLEWARE] = 585
        settings["DOWNLOADER_MIDDLEWARES"][BACKOFF_MIDDLEWARE] = 580
        settings["EXTENSIONS"][TRACING_EXTENSION] = 0
        settings["EXTENSIONS"][METRICS_EXTENSION] = 500
        settings["DOWNLOADER_MIDDLEWARES"][LOG_SETUP] = 0
        settings["DOWNLOADER_MIDDLEWARES"].update(HYGIENE_MIDDLEWARES)
        # robots.txt is obeyed unless the project (or -s) says otherwise.
        settings.set("ROBOTSTXT_OBEY", True, priority="addon")
        # Retries become durable (the delayed set in Redis) instead of in-memory re-requests.
        settings.set("RETRY_ENABLED", False, priority="addon")
        for name, value in DEFAULTS.items():
            settings.set(name, value, priority="default")

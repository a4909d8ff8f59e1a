"""Downloader middlewares (the Scrapy-facing faces of politeness), every one of them importable
from here: the one documented path (the site hygiene ones are defined in ``politeness/``, the
rendering sites' one in ``sites/render.py``).
Those that use Redis take the crawl's runtime
(:class:`~meteorseed_scrapy.politeness.runtime.CrawlRuntime`) in ``from_crawler`` and act only
once it is a worker crawl's: a local crawl (Scrapy's commands, the shell) passes through.

The fleet-wide quota and concurrency cap are enforced where requests are handed out (the
scheduler leases permits from Redis before dispatch; a middleware that waited would hold a
download slot). These middlewares classify what comes back:

* :class:`SiteSlotMiddleware` puts a task's requests into a download slot named for its site, so
  Scrapy's local per-slot limits apply per site.
* :class:`BackoffMiddleware`: 429/403 pause the whole site on every worker for
  ``max(Retry-After, base * 2^n) + jitter`` (capped) and tighten its rate for a while (``n``
  counts strikes: only a request granted its permit after the last pause began strikes, so a
  burst of 429s to requests in flight together is one); 5xx,
  timeouts and connection errors are retried durably with exponential backoff (the task goes to
  the delayed set in Redis, it holds no slot and survives a crash); 404/410 are terminal.
  Whether and when a failure is retried is :func:`durable_retry`'s decision, a function of the
  request and the site's health, made without Redis; whether a retry is left is Scrapy's own
  (:func:`retry_decision`), with its log lines and ``retry/*`` stats.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING

from scrapy import Request, Spider
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.misc import load_object
from scrapy.utils.response import response_status_message

from meteorseed_scrapy.address_policy import AddressPolicyMiddleware
from meteorseed_scrapy.observability.logging import LogSetupMiddleware
from meteorseed_scrapy.politeness.adaptive import AdaptiveThrottleMiddleware
from meteorseed_scrapy.politeness.blacklist import BlacklistMiddleware
from meteorseed_scrapy.politeness.cookie_warmup import CookieWarmupMiddleware
from meteorseed_scrapy.politeness.gate import PAUSE_LEAD_S, PauseResult, granted_at
from meteorseed_scrapy.politeness.policy import Backoff, parse_retry_after
from meteorseed_scrapy.politeness.proxies import ProxyPoolMiddleware
from meteorseed_scrapy.politeness.robotstxt import RobotsTxtMiddleware
from meteorseed_scrapy.politeness.runtime import CrawlRuntime
from meteorseed_scrapy.politeness.site_errors import SITE_ERRORS, SiteFaults
from meteorseed_scrapy.politeness.user_agents import UserAgentPoolMiddleware
from meteorseed_scrapy.settings import retry_http_codes, scrapy_count
from meteorseed_scrapy.sites.lookup import SiteConfigs, site_configs
from meteorseed_scrapy.sites.render import RenderMiddleware
from meteorseed_scrapy.task.context import LEASE_META_KEY, task_of
from meteorseed_scrapy.task.exceptions import DeferReason, TaskDeferred
from meteorseed_scrapy.worker.requests import status_allowed

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

PAUSE_CODES = frozenset({429, 403})


class SiteSlotMiddleware:
    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SiteSlotMiddleware:
        return cls()

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        task = task_of(request)
        if task is not None and "download_slot" not in request.meta:
            request.meta["download_slot"] = f"site:{task.site_id}"


def durable_retry(request: Request, retries: int, reason: str, scrapy_reason: str | Exception,
                  *, spider: Spider | None, max_retry_times: int, backoff: Backoff,
                  site_sick: bool) -> TaskDeferred | None:
    """The durable retry of a task whose download failed now after ``retries`` retries
    (``reason``: ours, ``scrapy_reason``: as Scrapy's RetryMiddleware names it), or None when it
    is not retried: ``dont_retry`` in its meta (as in Scrapy), or its retries are used up
    (:func:`retry_decision`), and the failure ends it.

    A site that looks down (``site_sick``: its breaker open, or this worker's window abnormal)
    is not the task's fault: its tasks wait without using up a retry, as does a failed probe.
    ``spider`` (with its crawler) is needed only to count a retry.
    """
    if request.meta.get("dont_retry"):
        return None
    probe = str(request.meta.get(LEASE_META_KEY, "")).endswith(":probe")
    count = not (site_sick or probe)
    if count and not retry_decision(request, retries, scrapy_reason,
                                    spider=_deciding(spider), max_retry_times=max_retry_times):
        return None
    delay = backoff.compute(retries if count else 0)
    return TaskDeferred(delay, f"{reason}, retry in {delay:.1f}s", count_retry=count,
                        why=DeferReason.RETRY if count else DeferReason.SICK)


def _deciding(spider: Spider | None) -> Spider:
    """The spider whose crawler Scrapy's retry decision logs and counts with."""
    if spider is None or getattr(spider, "crawler", None) is None:
        raise RuntimeError("BackoffMiddleware needs its crawler's spider to decide retries")
    return spider


#: Whether this Scrapy's ``get_retry_request`` takes ``give_up_log_level`` (2.17+).
_GIVE_UP_LEVEL = "give_up_log_level" in inspect.signature(get_retry_request).parameters


def retry_decision(request: Request, retries: int, reason: str | Exception, *,
                   spider: Spider, max_retry_times: int) -> bool:
    """Whether a task that failed now, after ``retries`` durable retries, may be retried once
    more: Scrapy's own decision (:func:`~scrapy.downloadermiddlewares.retry.get_retry_request`
    with ``retry_times`` = ``retries``), so Scrapy's log lines ("Retrying … (failed N times):
    reason" at DEBUG, "Gave up retrying …" at ``RETRY_GIVE_UP_LOG_LEVEL``) and stats
    (``retry/count``, ``retry/reason_count/<reason>``, ``retry/max_reached``) come with it."""
    attempt = request.replace(meta={**request.meta, "retry_times": retries})
    # (meta["give_up_log_level"], as Scrapy's RetryMiddleware reads it: Scrapy 2.17+; an
    # older Scrapy gives up at ERROR whatever the meta key says, and so do we there)
    level = ({"give_up_log_level": request.meta["give_up_log_level"]}
             if _GIVE_UP_LEVEL and request.meta.get("give_up_log_level") is not None else {})
    return get_retry_request(attempt, spider=spider, reason=reason,
                             max_retry_times=max_retry_times, **level) is not None


class BackoffMiddleware:
    """Turns throttling and transient failures into durable, fleet-wide backoff."""

    def __init__(self, runtime: CrawlRuntime, max_retries: int, stats: StatsCollector,
                 settings: BaseSettings, configs: SiteConfigs | None = None,
                 crawler: Crawler | None = None) -> None:
        self.crawler = crawler  # (its spider asks Scrapy whether to retry)
        self.runtime = runtime  # its gate and breaker, once the crawl is a worker crawl
        self.backoff = runtime.backoff
        self.max_retries = max_retries
        self.configs = configs  # a site's rule config may set its own limits.retries
        # Scrapy's own lists of what is worth retrying (the RetryMiddleware this replaces).
        self.retry_codes = retry_http_codes(settings) - PAUSE_CODES
        self.retry_exceptions = tuple(
            load_object(x) if isinstance(x, str) else x
            for x in settings.getlist("RETRY_EXCEPTIONS")
        )
        self.stats = stats
        self.settings = settings
        # RETRY_ENABLED = False: no task is retried, as if each had meta["dont_retry"].
        self.enabled = settings.getbool("RETRY_ENABLED", True)
        self.faults = SiteFaults("pause", stats, runtime.full)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BackoffMiddleware:
        settings = crawler.settings
        return cls(CrawlRuntime.of(crawler), scrapy_count(settings, "RETRY_TIMES"),
                   crawler.stats, settings, site_configs(crawler), crawler)

    def retries_for(self, site: str, request: Request | None = None) -> int:
        """The retries a task may use up: its request's ``max_retry_times`` (as in Scrapy),
        else its site's ``limits.retries``, else ``RETRY_TIMES``."""
        own = request.meta.get("max_retry_times") if request is not None else None
        if own is not None:
            return int(own)  # checked when the task was made (worker.requests)
        config = self.configs.get(site) if self.configs is not None else None
        if config is not None and config.limits.retries is not None:
            return config.limits.retries
        return self.max_retries

    async def process_response(self, request: Request, response: Response,
                               spider: Spider | None = None) -> Response:
        task = task_of(request)
        status = response.status
        if task is None or status < 400:
            return response
        if status_allowed(status, request, spider, self.settings):
            return response
        site = task.site_id
        if status in PAUSE_CODES and self.runtime.worker:
            delay = await self._pause(request, site, status, response)
            if not self._may_retry(request):  # the site stays paused; this task ends now
                return response
            # A 429 is the site asking us to slow down: the task is held back, not failed. A 403
            # may be for good, so it uses up a retry. Either waits for the site's pause.
            if status == 429:
                raise TaskDeferred(delay, f"HTTP {status}", count_retry=False,
                                   why=DeferReason.PAUSED)
            if self._counted(request, task.retry_count, response_status_message(status),
                             spider):
                raise TaskDeferred(delay, f"HTTP {status}", count_retry=True,
                                   why=DeferReason.PAUSED)
            return response
        if status in self.retry_codes:
            self._retry_or_pass(request, task.site_id, task.retry_count, f"HTTP {status}",
                                response_status_message(status), spider)
        return response

    async def _pause(self, request: Request, site: str, status: int,
                     response: Response) -> float:
        """Pause ``site`` for a 429/403; returns the seconds its task waits: for the site's
        pause, due back a little ahead of its end (the gate holds it until then). Only a
        request granted its permit after the site's last pause began strikes: a burst of 429s
        to requests in flight together is one strike, the rest confirm its pause."""
        retry_after = parse_retry_after(response.headers.get(b"Retry-After"),
                                        response.headers.get(b"Date"))
        self.stats.inc_value(f"meteorseed/throttled/{site}/{status}")
        self.runtime.breaker.throttled(site)  # trouble: the fleet's give-up clock runs
        try:
            result: PauseResult = await self.runtime.gate.pause(
                site, retry_after, granted_at(request.meta.get(LEASE_META_KEY)))
        except SITE_ERRORS as exc:  # the site's pause state is corrupt: its task waits alone
            self.faults.failed(site, exc)
            return self.backoff.compute(0, retry_after)
        self.faults.ok(site)
        if not result.new_strike:
            logger.debug("Site %s answered %d to a request sent before its pause: pause "
                         "confirmed, %.1fs left", site, status, result.pause_s)
            return max(0.0, result.pause_s - PAUSE_LEAD_S)
        self.stats.inc_value(f"meteorseed/throttled/{site}/strikes")
        logger.warning(
            "Site %s answered %d (Retry-After %s): paused %.1fs on every worker (strike %d)",
            site, status, retry_after, result.pause_s, result.strikes,
        )
        return max(0.0, result.pause_s - PAUSE_LEAD_S)

    async def process_exception(self, request: Request, exception: Exception,
                                spider: Spider | None = None) -> None:
        task = task_of(request)
        if task is None or isinstance(exception, IgnoreRequest):
            return None
        if isinstance(exception, self.retry_exceptions):
            self._retry_or_pass(request, task.site_id, task.retry_count, type(exception).__name__,
                                exception, spider)
        return None

    def _spider(self, spider: Spider | None) -> Spider | None:
        return spider or (self.crawler.spider if self.crawler is not None else None)

    def _may_retry(self, request: Request) -> bool:
        return self.enabled and not request.meta.get("dont_retry")

    def _counted(self, request: Request, retries: int, scrapy_reason: str | Exception,
                 spider: Spider | None) -> bool:
        """Whether the task may use up one more retry (:func:`retry_decision`)."""
        task = task_of(request)
        site = task.site_id if task is not None else ""
        return retry_decision(request, retries, scrapy_reason,
                              spider=_deciding(self._spider(spider)),
                              max_retry_times=self.retries_for(site, request))

    def _retry_or_pass(self, request: Request, site: str, retries: int, reason: str,
                       scrapy_reason: str | Exception, spider: Spider | None) -> None:
        """Raise the task's durable retry (:func:`durable_retry`), or return when the failure
        ends it. ``RETRY_ENABLED`` off: never retried, as if every task had ``dont_retry``."""
        if not self.enabled:
            return
        runtime = self.runtime
        deferred = durable_retry(
            request, retries, reason, scrapy_reason, spider=self._spider(spider),
            max_retry_times=self.retries_for(site, request), backoff=self.backoff,
            site_sick=runtime.worker and runtime.breaker.unhealthy(site))
        if deferred is None:
            return
        self.stats.inc_value(f"meteorseed/retry/{site}/{reason.replace(' ', '_')}")
        raise deferred


class CircuitBreakerMiddleware:
    """Feeds each download's outcome (error or not, latency) to the site's circuit breaker."""

    def __init__(self, runtime: CrawlRuntime) -> None:
        self.runtime = runtime  # its breaker, once the crawl is a worker crawl

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CircuitBreakerMiddleware:
        return cls(CrawlRuntime.of(crawler))

    def _record(self, request: Request, error: bool, good: bool = False) -> None:
        task = task_of(request)
        if task is None or not self.runtime.worker:
            return
        probe = str(request.meta.get(LEASE_META_KEY, "")).endswith(":probe")
        self.runtime.breaker.record(task.site_id, error,
                                    request.meta.get("download_latency", 0.0), probe,
                                    task.task_id, good)

    def process_response(self, request: Request, response: Response,
                         spider: Spider | None = None) -> Response:
        status = response.status
        self._record(request, status >= 500, status < 500 and status not in PAUSE_CODES)
        return response

    def process_exception(self, request: Request, exception: Exception,
                          spider: Spider | None = None) -> None:
        if not isinstance(exception, IgnoreRequest):
            self._record(request, True)


__all__ = ["AdaptiveThrottleMiddleware", "AddressPolicyMiddleware", "BackoffMiddleware",
           "BlacklistMiddleware", "CircuitBreakerMiddleware", "CookieWarmupMiddleware",
           "LogSetupMiddleware", "ProxyPoolMiddleware", "RenderMiddleware",
           "RobotsTxtMiddleware", "SiteSlotMiddleware", "UserAgentPoolMiddleware",
           "durable_retry", "retry_decision"]

"""Per-site request hygiene: the rules a site's config sets for every request sent to it.

Downloader middlewares (registered by the add-on; see docs/politeness.md):

* :class:`BlacklistMiddleware` (60): a URL matching one of the site's ``blacklist`` patterns is
  never fetched (``IgnoreRequest`` naming the pattern: the task is acked as ignored; stats
  ``meteorseed/blacklisted/<site>``). A site with ``robots: false`` gets ``dont_obey_robotstxt``.
* :class:`CookieWarmupMiddleware` (90): for a site with ``cookie_warmup: true``, the first request
  to it on this worker first waits for a GET of the site's home page, so the cookies it sets are
  in the jar (Scrapy's CookiesMiddleware, 700) when the real request goes out.
* :class:`RobotsTxtMiddleware` (100, in place of Scrapy's, which it extends) is on by default
  (``ROBOTSTXT_OBEY`` at add-on priority); it caches one parsed robots.txt per host for the
  crawl.
* :class:`UserAgentPoolMiddleware` (390, before Scrapy's UserAgentMiddleware): the site's
  ``headers`` (as defaults) and a User-Agent from its ``user_agents`` (round-robin), unless the
  request has an explicit one.
* :class:`ProxyPoolMiddleware` (740, before HttpProxyMiddleware): a proxy from the site's
  ``proxies``; connection errors, timeouts, 407 and 5xx count against the proxy, which after
  ``METEORSEED_PROXY_MAX_FAILURES`` in a row cools down for ``METEORSEED_PROXY_COOLDOWN`` s.

The site's config is looked up by the task's ``site_id`` via :func:`site_config`
(:mod:`meteorseed_scrapy.politeness.site_configs`). Each middleware lives in a module of its own;
this module gathers them under the path the add-on, ``meteorseed_scrapy.middlewares`` and users
import them from.
"""

from __future__ import annotations

from meteorseed_scrapy.politeness.blacklist import BlacklistMiddleware
from meteorseed_scrapy.politeness.cookie_warmup import CookieWarmupMiddleware
from meteorseed_scrapy.politeness.proxies import (
    PROXY_META_KEY,
    ProxyPool,
    ProxyPoolMiddleware,
    ProxyState,
)
from meteorseed_scrapy.politeness.robotstxt import RobotsTxtMiddleware
from meteorseed_scrapy.politeness.site_configs import (
    FETCH_ATTEMPTS,
    SITE_META_KEY,
    SiteConfigs,
    site_config,
    site_configs,
    site_of,
)
from meteorseed_scrapy.politeness.user_agents import UserAgentPoolMiddleware

__all__ = ["FETCH_ATTEMPTS", "PROXY_META_KEY", "SITE_META_KEY", "BlacklistMiddleware",
           "CookieWarmupMiddleware", "ProxyPool", "ProxyPoolMiddleware", "ProxyState",
           "RobotsTxtMiddleware", "SiteConfigs", "UserAgentPoolMiddleware", "site_config",
           "site_configs", "site_of"]

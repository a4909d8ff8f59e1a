"""Scrapy's own per-process limits that hold a worker below its sites' fleet-wide limits.

Each site's requests go through one Scrapy download slot per worker (``site:<site_id>``), so
Scrapy's ``DOWNLOAD_DELAY`` and ``CONCURRENT_REQUESTS_PER_DOMAIN`` / ``_PER_IP`` still apply to
each worker, on top of the fleet-wide quota (``METEORSEED_SITE_RATE`` /
``METEORSEED_SITE_CONCURRENCY``, or a site's rule config). The project template of
``scrapy startproject`` sets ``DOWNLOAD_DELAY = 1`` and ``CONCURRENT_REQUESTS_PER_DOMAIN = 1``:
a worker then sends one request a second to a site whose rule allows two, and nothing said so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meteorseed_scrapy.settings import flag_setting, integer_setting, number_setting
from meteorseed_scrapy.validators import to_integer, to_number

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

ADVICE = ("remove them from settings.py (the template of `scrapy startproject` sets "
          "DOWNLOAD_DELAY = 1 and CONCURRENT_REQUESTS_PER_DOMAIN = 1): the fleet-wide quota "
          "is the politeness limit here, set per site in its rule config or with "
          "METEORSEED_SITE_RATE / METEORSEED_SITE_CONCURRENCY")


def _given(settings: BaseSettings, name: str) -> bool:
    """Set by the project, a spider or ``-s`` (not Scrapy's default)."""
    return bool((settings.getpriority(name) or 0) > 0)


def local_limits(settings: BaseSettings) -> list[str]:
    """What each of Scrapy's limits given in ``settings`` does to a worker that its sites'
    default limits would not: one phrase each, empty when nothing holds it back."""
    if not flag_setting(settings, "METEORSEED_POLITENESS"):
        return []  # no fleet-wide quota: Scrapy's limits are the only ones, as meant
    rate = number_setting(settings, "METEORSEED_SITE_RATE", positive=True)
    concurrency = integer_setting(settings, "METEORSEED_SITE_CONCURRENCY", minimum=1)
    found = []
    if _given(settings, "DOWNLOAD_DELAY"):
        delay = to_number(settings.get("DOWNLOAD_DELAY"), "DOWNLOAD_DELAY")
        if delay > 0 and 1 / delay < rate:
            found.append(f"DOWNLOAD_DELAY = {delay:g} holds each worker to {1 / delay:g} "
                         f"request(s)/s per site, below METEORSEED_SITE_RATE = {rate:g}")
    for name in ("CONCURRENT_REQUESTS_PER_DOMAIN", "CONCURRENT_REQUESTS_PER_IP"):
        if _given(settings, name):
            value = to_integer(settings.get(name), name)
            if 0 < value < concurrency:
                found.append(f"{name} = {value} holds each worker to {value} request(s) in "
                             f"flight per site, below METEORSEED_SITE_CONCURRENCY = "
                             f"{concurrency}")
    return found


def local_limits_warning(settings: BaseSettings) -> str | None:
    """The one warning line about :func:`local_limits`, or None."""
    found = local_limits(settings)
    if not found:
        return None
    return (f"{'; '.join(found)}. Scrapy applies these in each worker on top of the fleet-wide "
            f"quota, so a site is crawled slower than its limits allow; {ADVICE}")

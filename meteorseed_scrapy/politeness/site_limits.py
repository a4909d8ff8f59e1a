"""The limits of each site: the settings' defaults, overridden by the site's rule config."""

from __future__ import annotations

from typing import Any

from meteorseed_scrapy.politeness.policy import SiteLimits
from meteorseed_scrapy.sites.lookup import SiteConfigs


class SiteLimitsLookup:
    """``lookup(site_id)``: the site's :class:`SiteLimits`, hot-reloaded with its rule config
    (computed once per config object, then cached)."""

    def __init__(self, defaults: SiteLimits, configs: SiteConfigs) -> None:
        self.defaults = defaults
        self.configs = configs
        self._limits: dict[str, tuple[Any, SiteLimits]] = {}  # site -> (its config, limits)

    def __call__(self, site_id: str) -> SiteLimits:
        config = self.configs.get(site_id)
        if config is None:
            return self.defaults
        cached = self._limits.get(site_id)
        if cached is None or cached[0] is not config:
            cached = self._limits[site_id] = (
                config, self.defaults.overridden(config.limits, robots=config.robots))
        return cached[1]


__all__ = ["SiteLimitsLookup"]

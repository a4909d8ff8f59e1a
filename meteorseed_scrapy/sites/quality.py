"""Data quality where the data is produced: constraint checks and per-site anomaly rates.

:func:`check` lists why an item is anomalous (empty required field, broken constraint,
a value no processor could parse). :class:`AnomalyTracker` keeps per-site counts in the
crawl stats (``meteorseed/anomalies/<site>`` is the rate so far) and flags a sudden jump: the
rate over the last ``window`` items far above the rate before them, which is what broken
selectors after a site redesign look like.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.sites.extract import Parsed
from meteorseed_scrapy.sites.model import FieldRule, SiteConfig

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)
STATS_PREFIX = "meteorseed/anomalies/"
WINDOW = 20


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _problems(rule: FieldRule, value: Any, now: datetime) -> list[str]:
    c, out = rule.constraint, []
    if isinstance(value, (str, list)):
        if c.min_length is not None and len(value) < c.min_length:
            out.append(f"shorter than {c.min_length} ({len(value)})")
        if c.max_length is not None and len(value) > c.max_length:
            out.append(f"longer than {c.max_length} ({len(value)})")
    if isinstance(value, dict) and "amount" in value:
        value = value["amount"]  # a price: min/max bound its amount
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if c.minimum is not None and value < c.minimum:
            out.append(f"below {c.minimum:g} ({value})")
        if c.maximum is not None and value > c.maximum:
            out.append(f"above {c.maximum:g} ({value})")
    if (c.not_before or c.not_future) and isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return [*out, f"not a date ({value[:40]!r})"]
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        if c.not_before is not None and moment < c.not_before:
            out.append(f"before {c.not_before:%Y-%m-%d} ({value})")
        if c.not_future and moment > now:
            out.append(f"in the future ({value})")
    return out


def check(config: SiteConfig, parsed: Parsed, now: datetime | None = None) -> list[str]:
    """Reasons why ``parsed`` is anomalous (``"field: problem"``); empty when it is fine."""
    now = now or datetime.now(timezone.utc)
    reasons = list(parsed.problems)
    failed = {reason.split(":", 1)[0] for reason in reasons}
    for rule in config.fields:
        if rule.name in failed:
            continue
        value = parsed.fields.get(rule.name)
        if _empty(value):
            if rule.required:
                reasons.append(f"{rule.name}: required but empty")
            continue
        reasons.extend(f"{rule.name}: {problem}" for problem in _problems(rule, value, now))
    return reasons


@dataclass
class _SiteCounts:
    checked: int = 0
    anomalies: int = 0
    recent: deque[bool] = field(default_factory=lambda: deque(maxlen=WINDOW))
    flagged: bool = False


class AnomalyTracker:
    """Per-site anomaly counts in the stats, and a warning when the rate jumps."""

    def __init__(self, stats: StatsCollector | None, window: int = WINDOW) -> None:
        self.stats = stats
        self.window = window
        self._sites: dict[str, _SiteCounts] = {}

    def record(self, config: SiteConfig, anomalous: bool) -> bool:
        """Count one item of ``config``'s site; True when this item reveals a jump."""
        site = self._sites.setdefault(config.site_id, _SiteCounts(
            recent=deque(maxlen=self.window)))
        site.checked += 1
        site.anomalies += anomalous
        site.recent.append(anomalous)
        prefix = STATS_PREFIX + config.site_id
        if self.stats is not None:
            self.stats.set_value(prefix, round(site.anomalies / site.checked, 4))
            self.stats.set_value(prefix + "/checked", site.checked)
            self.stats.set_value(prefix + "/count", site.anomalies)
        before = site.checked - len(site.recent)
        if len(site.recent) < self.window or before < self.window:
            return False  # too little history to tell a jump from the site's usual level
        recent_rate = sum(site.recent) / len(site.recent)
        baseline = (site.anomalies - sum(site.recent)) / before
        if not site.flagged and recent_rate - baseline >= config.jump_threshold:
            site.flagged = True
            if self.stats is not None:
                self.stats.inc_value(prefix + "/jumps")
            logger.warning(
                "Anomaly rate of site %s jumped from %.0f%% to %.0f%% over the last %d items"
                " (rule version %s, %s): its selectors may no longer match the pages",
                config.site_id, baseline * 100, recent_rate * 100, len(site.recent),
                config.version, config.source)
            return True
        if site.flagged and recent_rate - baseline < config.jump_threshold / 2:
            site.flagged = False
            logger.info("Anomaly rate of site %s is back to %.0f%%", config.site_id,
                        recent_rate * 100)
        return False

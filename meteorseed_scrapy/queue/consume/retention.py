"""How long dead letters and departed consumers are kept: a worker's periodic chores.

Acknowledged tasks leave no history in the task streams (an entry is XDEL'd with its XACK);
what is kept of them is their completion record, for ``METEORSEED_DONE_TTL`` seconds. Dead
letters stay until an operator requeues or purges them, or until they are older than
``METEORSEED_DEAD_RETENTION`` seconds or beyond the newest ``METEORSEED_DEAD_MAXLEN``. The dead
stream has no consumer group: trimming it never drops a task that could still run.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meteorseed_scrapy.queue.consume.group import ConsumerGroup
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import DEFAULTS, duration_setting, integer_setting

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis
    from meteorseed_scrapy.settings import SettingsSource

logger = logging.getLogger(__name__)

TRIM_EVERY_S = 60.0


@dataclass(frozen=True)
class DeadLetterRetention:
    seconds: float = DEFAULTS["METEORSEED_DEAD_RETENTION"]  # 0: kept until purged
    maxlen: int = DEFAULTS["METEORSEED_DEAD_MAXLEN"]  # 0: no cap

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> DeadLetterRetention:
        return cls(
            seconds=duration_setting(settings, "METEORSEED_DEAD_RETENTION"),
            maxlen=integer_setting(settings, "METEORSEED_DEAD_MAXLEN"),
        )

    @property
    def active(self) -> bool:
        return self.seconds > 0 or self.maxlen > 0

    async def trim(self, redis: AsyncRedis, keys: KeyLayout) -> int:
        """Trim the dead-letter streams once; returns how many entries went. Approximate (``~``):
        Redis drops whole nodes only, so a few entries past the limits may stay a while. On a
        cluster with stream shards each shard's dead letters keep their share of the length
        limit."""
        removed = 0
        deads = keys.deads
        if self.seconds > 0:
            secs, _ = await redis.time()  # Redis's clock, as the entry ids are
            min_id = max(0, int((int(secs) - self.seconds) * 1000))
            for dead in deads:
                removed += int(await redis.xtrim(dead, minid=min_id, approximate=True))
        if self.maxlen > 0:
            share = -(-self.maxlen // len(deads))
            for dead in deads:
                removed += int(await redis.xtrim(dead, maxlen=share, approximate=True))
        return removed

    async def trim_logged(self, redis: AsyncRedis, keys: KeyLayout, stats: StatsCollector) -> None:
        if not self.active:
            return
        removed = await self.trim(redis, keys)
        if removed:
            stats.inc_value("meteorseed/dead/trimmed", removed)
            logger.info("Trimmed %d dead letters past their retention (%s)", removed, self)


async def housekeeping(retention: DeadLetterRetention, group: ConsumerGroup,
                       prune_idle_s: float, stats: StatsCollector) -> None:
    """A worker's chores about once a minute until cancelled: dead-letter retention, and the
    removal of consumers that hold nothing and were gone for ``prune_idle_s`` (0: kept).
    Redis errors are logged and the chores tried again later."""
    # Workers started together should not all do it at the same moment.
    await asyncio.sleep(random.uniform(1.0, TRIM_EVERY_S))
    while True:
        try:
            await retention.trim_logged(group.redis, group.keys, stats)
            if prune_idle_s > 0:
                pruned = await group.prune(prune_idle_s)
                if pruned:
                    stats.inc_value("meteorseed/consumers/pruned", len(pruned))
                    logger.info("Removed %d consumer(s) holding nothing, gone for over %.0f s:"
                                " %s", len(pruned), prune_idle_s, ", ".join(pruned))
        except Exception as exc:  # Redis away: the pump says so; try again later
            logger.debug("Housekeeping failed: %s", exc)
        await asyncio.sleep(TRIM_EVERY_S * random.uniform(0.8, 1.2))

    def __str__(self) -> str:
        age = f"{self.seconds:g} s" if self.seconds > 0 else "any age"
        count = f"the newest {self.maxlen}" if self.maxlen > 0 else "any number"
        return f"METEORSEED_DEAD_RETENTION {age}, METEORSEED_DEAD_MAXLEN {count}"

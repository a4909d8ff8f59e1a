"""How long dead letters are kept: trimmed by age and count, by every worker, now and then.

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
from typing import Any

from meteorseed_scrapy.keys import KeyLayout
from meteorseed_scrapy.politeness.policy import positive_number

logger = logging.getLogger(__name__)

TRIM_EVERY_S = 60.0


@dataclass(frozen=True)
class DeadLetterRetention:
    seconds: float = 30 * 86400  # 0: kept until purged
    maxlen: int = 1_000_000  # 0: no cap

    @classmethod
    def from_settings(cls, settings: Any) -> DeadLetterRetention:
        return cls(
            seconds=positive_number("METEORSEED_DEAD_RETENTION",
                                    settings.get("METEORSEED_DEAD_RETENTION", cls.seconds),
                                    allow_zero=True),
            maxlen=positive_number("METEORSEED_DEAD_MAXLEN",
                                   settings.get("METEORSEED_DEAD_MAXLEN", cls.maxlen), int,
                                   allow_zero=True),
        )

    @property
    def active(self) -> bool:
        return self.seconds > 0 or self.maxlen > 0

    async def trim(self, redis: Any, keys: KeyLayout) -> int:
        """Trim the dead-letter stream once; returns how many entries went. Approximate (``~``):
        Redis drops whole nodes only, so a few entries past the limits may stay a while."""
        removed = 0
        if self.seconds > 0:
            secs, _ = await redis.time()  # Redis's clock, as the entry ids are
            min_id = max(0, int((int(secs) - self.seconds) * 1000))
            removed += int(await redis.xtrim(keys.dead, minid=min_id, approximate=True))
        if self.maxlen > 0:
            removed += int(await redis.xtrim(keys.dead, maxlen=self.maxlen, approximate=True))
        return removed

    async def run(self, redis: Any, keys: KeyLayout, stats: Any) -> None:
        """Trim every ~minute until cancelled; Redis errors are logged and retried later."""
        # Workers started together should not all trim at the same moment.
        await asyncio.sleep(random.uniform(1.0, TRIM_EVERY_S))
        while True:
            try:
                removed = await self.trim(redis, keys)
            except Exception as exc:  # Redis away: the pump says so; try again later
                logger.debug("Dead-letter trim failed: %s", exc)
            else:
                if removed:
                    stats.inc_value("meteorseed/dead/trimmed", removed)
                    logger.info("Trimmed %d dead letters past their retention (%s)", removed,
                                self)
            await asyncio.sleep(TRIM_EVERY_S * random.uniform(0.8, 1.2))

    def __str__(self) -> str:
        age = f"{self.seconds:g} s" if self.seconds > 0 else "any age"
        count = f"the newest {self.maxlen}" if self.maxlen > 0 else "any number"
        return f"METEORSEED_DEAD_RETENTION {age}, METEORSEED_DEAD_MAXLEN {count}"

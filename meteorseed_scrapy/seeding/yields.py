"""Workers report the new URLs their callbacks found per seed: the yield that adapts a
scheduled seed's interval (``SeedRegistry.add_yield``; see docs/seeding.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from meteorseed_scrapy.seeding.registry import SeedRegistry

logger = logging.getLogger(__name__)

REPORT_EVERY_S = 5.0


class YieldReporter:
    """Sends ``counts`` (seed_id -> new child URLs, filled in by the worker's pump) to the
    registry every few seconds in one round trip; counts that could not be sent stay for the
    next report."""

    def __init__(self, registry: SeedRegistry, counts: Counter[str]) -> None:
        self.registry = registry
        self.counts = counts

    async def report(self) -> None:
        if not self.counts:
            return
        batch = Counter(self.counts)
        self.counts.clear()
        try:
            await self.registry.add_yield(batch)
        except BaseException:
            self.counts.update(batch)  # Redis away: kept for the next report
            raise

    async def run(self) -> None:
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            try:
                await self.report()
            except Exception as exc:  # the pump already says when Redis is away
                logger.debug("Seed yield report failed, kept for later: %s", exc)

    async def close(self) -> None:
        """A last report at shutdown (best effort: the counts only tune schedules)."""
        with contextlib.suppress(Exception):
            await self.report()

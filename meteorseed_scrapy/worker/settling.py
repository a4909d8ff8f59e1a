"""Acting on a task's fate: the facts of its final hop go to the ledger, and once
:func:`.fate.settled_now` says it is settled, it leaves the ledger and the completions queue
what its verdict needs (an ack, a dead letter, a deferral or a failure note). A task that has
not started may be parked for later instead, or given up on while it waited.

A task ending in too many redirects (a loop, or a chain longer than ``REDIRECT_MAX_TIMES``):
Scrapy's ``RedirectMiddleware`` discards such a request with ``IgnoreRequest("max redirections
reached")`` and a DEBUG line: the task would end ``ignored`` with nothing at the default log
level naming it. For a worker that is a page given up on for good, so it is said at WARNING
(as Scrapy says a request it gave up retrying), naming the task's URL, the redirect count and
whether it loops, and the reason is kept for its completion record
(:func:`too_many_redirects`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.python.failure import Failure

from meteorseed_scrapy.politeness.breaker import Breaker
from meteorseed_scrapy.settings import scrapy_count
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.completions import Completions
from meteorseed_scrapy.worker.fate import (
    Outcome,
    Verdict,
    WhatHappened,
    fate,
    final_hop,
    settled_now,
    trouble_wait,
    what_happened,
)
from meteorseed_scrapy.worker.ledger import Entry, TaskLedger
from meteorseed_scrapy.worker.signals import task_settled

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

REDIRECTS_STAT = "meteorseed/redirects/too_many"


class Settling:
    def __init__(self, ledger: TaskLedger, completions: Completions, breaker: Breaker,
                 crawler: Crawler, spider: Spider | None, *, on_settled: Callable[[], None],
                 on_parked: Callable[[str], None]) -> None:
        self._ledger = ledger
        self._completions = completions
        self._breaker = breaker
        self._stats = crawler.stats
        self._signals = crawler.signals
        self._settings = crawler.settings
        # (read once, as RedirectMiddleware does: settings are frozen by now)
        self._max_redirects = scrapy_count(crawler.settings, "REDIRECT_MAX_TIMES")
        self._spider = spider
        self._on_settled = on_settled  # capacity came free
        self._on_parked = on_parked  # (task_id) will not start soon
        # Runs a given-up task's errback in the scraper (ScrapeTracker.give_up); False: none.
        self.give_up: Callable[[ExecTask, str], bool] | None = None

    def finished(self, entry: Entry, request: Request, result: Response | Failure) -> None:
        """``entry``'s final hop (``request``) ended with ``result`` and its scrape is over."""
        redirects = too_many_redirects(request, result, self._max_redirects)
        if redirects:
            logger.warning("Task %s ignored: %s", entry.task.task_id, redirects)
            self._stats.inc_value(REDIRECTS_STAT)
            result = Failure(IgnoreRequest(redirects))
        scrape = entry.scrape
        if scrape is not None and isinstance(result, Response):
            scrape.bytes = len(result.body)
        output = entry.children + (scrape.committed + scrape.keyless_items if scrape else 0)
        self.record(entry, what_happened(
            entry.task, request, result, spider=self._spider, settings=self._settings,
            output=output > 0 and not (scrape and scrape.errors),
            trouble=partial(self.trouble, entry.task.site_id)))

    def record(self, entry: Entry, happened: WhatHappened) -> None:
        if self._ledger.finish_scrape(entry.task.task_id, happened) is None:
            return  # (not held, or finished already)
        hop = final_hop(happened)
        if hop.outcome is Outcome.GONE:
            self._stats.inc_value(f"meteorseed/gone/{hop.status}")
        self._settle_if_due(entry)

    def child_durable(self, parent_id: str) -> None:
        entry = self._ledger.child_durable(parent_id)
        if entry is not None:
            self._settle_if_due(entry)

    def park(self, entry: Entry, delay_s: float, why: DeferReason = DeferReason.OTHER) -> None:
        """Put a task that has not started back for later (its site may not be fetched now),
        or dead-letter it when its site's trouble lasted too long."""
        reason, delay_s = self.trouble(entry.task.site_id, delay_s, why)
        if reason:
            # Its errback runs all the same, once, as at any final failure (stock Scrapy calls
            # it for a request that never reached the network too).
            entry.started = True  # (in the scraper: a takeover must not drop its entry)
            if self.give_up is None or not self.give_up(entry.task, reason):
                self._settle(entry, fate(WhatHappened(entry.task, given_up=reason)))
            return
        self._ledger.pop(entry.task.task_id)
        self._completions.parked(entry, delay_s, why)
        self._on_parked(entry.task.task_id)

    def trouble(self, site: str, delay_s: float, why: DeferReason) -> tuple[str, float]:
        reason, delay_s = trouble_wait(self._breaker, site, delay_s, why)
        if reason:
            self._stats.inc_value(f"meteorseed/given_up/{site}")
        return reason, delay_s

    def _settle_if_due(self, entry: Entry) -> None:
        # (the scrape's errors as they stand now: a child refused by the writer fails it late;
        # they are only ever appended to, so an equal count means nothing new)
        happened, scrape = entry.happened, entry.scrape
        if happened is not None and scrape is not None and (
                len(happened.errors) != len(scrape.errors) or happened.lasting != scrape.lasting):
            happened = replace(happened, errors=tuple(scrape.errors), lasting=scrape.lasting)
        verdict = settled_now(happened, entry.children_pending)
        if verdict is not None:
            self._settle(entry, verdict)

    def _settle(self, entry: Entry, verdict: Verdict) -> None:
        entry.verdict = verdict
        self._ledger.pop(entry.task.task_id)
        self._on_settled()
        self._completions.settled(entry, verdict)
        self._signals.send_catch_log(task_settled, task=entry.task, outcome=verdict.outcome,
                                     reason=verdict.reason)


def too_many_redirects(request: Request, result: Response | Failure, max_times: int) -> str:
    """Why ``request``'s ``result`` is the end of too many redirects, or "" when it is not."""
    if not isinstance(result, Failure) or not isinstance(result.value, IgnoreRequest):
        return ""
    times = int(request.meta.get("redirect_times", 0))
    if not times or (times < max_times and request.meta.get("redirect_ttl") != 0):
        return ""
    urls = [str(url) for url in request.meta.get("redirect_urls", [])]
    first = urls[0] if urls else request.url
    shape = (f"a loop (back to {request.url})" if request.url in urls
             else f"a chain ending at {request.url}")
    return f"{first} redirected {times} times, {shape}: more than REDIRECT_MAX_TIMES allows"


__all__ = ["REDIRECTS_STAT", "Settling", "too_many_redirects"]

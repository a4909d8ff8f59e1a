"""Which task Scrapy's scraper works for, and when it is done with a response.

Scrapy says neither which response an item or a yielded request came from, nor when every item
of a response passed the item pipelines. ``Scraper.enqueue_scrape`` is wrapped (through
:mod:`~meteorseed_scrapy.scrapy_internals`, like every private part of Scrapy used here): while
it runs, the scrape of the response's task is current
(:data:`~meteorseed_scrapy.task.context.CURRENT_SCRAPE`, inherited by every asyncio task Scrapy
starts there: callback output, item pipelines, item signals), and the pump hears when its
Deferred fires. Item and callback errors fail the scrape in progress: its task is not acked.

That Deferred fires several turns of a busy event loop after the scrape's last item was
committed; so the callback's output is counted too (``handle_spider_output_async`` and
``_process_spidermw_output_async``, wrapped the same way; Scrapy 2.13+), and a scrape whose
output ran out and is all through ends there (:meth:`Scrape.when_done`). Where Scrapy lacks
them, or an output fails, Scrapy's Deferred ends the scrape.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals
from scrapy.http import Response
from twisted.internet.defer import Deferred, fail, succeed
from twisted.python.failure import Failure

from meteorseed_scrapy.scrapy_internals import ScraperPatch
from meteorseed_scrapy.task.context import (
    CURRENT_OUTPUT,
    CURRENT_SCRAPE,
    Output,
    Scrape,
    current_scrape,
)
from meteorseed_scrapy.task.exceptions import TaskDeferred, TaskGivenUp
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError
from meteorseed_scrapy.worker import fate
from meteorseed_scrapy.worker.pump import StreamPump
from meteorseed_scrapy.worker.requests import task_to_request

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

TRACEBACK_FRAMES = 4  # of a spider's error, in the reason of its task's dead letter


class ScrapeTracker:
    def __init__(self, crawler: Crawler, pump: StreamPump, patch: ScraperPatch) -> None:
        self.crawler = crawler
        self._pump = pump
        self._patch = patch
        self._original = self._patch.enqueue_scrape
        self._handle_output = self._patch.handle_output
        self._process_output = self._patch.process_output
        self._counting = self._patch.counting

    def install(self) -> None:
        self._patch.install(self._enqueue_scrape, self._counted_output, self._one_output)
        self._pump.give_up_with(self.give_up)
        self.crawler.signals.connect(self._on_item_error, signals.item_error)
        self.crawler.signals.connect(self._on_spider_error, signals.spider_error)

    def uninstall(self) -> None:
        self._patch.restore()

    def _enqueue_scrape(self, result: Response | Failure, request: Request) -> Deferred[Any]:
        scrape = self._pump.scrape_started(request)
        if scrape is None:  # no task of ours (a local request): nor may a leaked one be current
            token = CURRENT_SCRAPE.set(None)
            try:
                return self._original(result, request)
            finally:
                CURRENT_SCRAPE.reset(token)
        deferred = result.check(TaskDeferred) and result.value if isinstance(result, Failure) \
            else None
        if isinstance(deferred, TaskDeferred):
            reason = self._pump.deferral_ends(request, deferred)
            if not reason:
                # A wait, not the end: the errback runs once, at the task's final failure (as
                # with Scrapy's own retries), not at every deferral or pause.
                self._pump.finished(request, result)
                return succeed(None)
            result = Failure(TaskGivenUp(reason))
        if self._counting:
            scrape.when_done(lambda: self._finished(None, result, request, scrape))
        token = CURRENT_SCRAPE.set(scrape)
        try:
            dfd: Deferred[Any] = self._original(result, request)
        except Exception:
            # Settled all the same (else held, kept alive, for ever); the engine hears of the
            # error through the Deferred, as from Scrapy's own (inlineCallbacks) method.
            dfd = fail()
        finally:
            CURRENT_SCRAPE.reset(token)
        dfd.addBoth(self._finished, result, request, scrape)
        return dfd

    async def _counted_output(self, output: Iterable[Any] | AsyncIterator[Any], request: Request,
                              response: Response | Failure) -> None:
        scrape = current_scrape()
        if scrape is not None:
            output = (_count_async(output, scrape) if isinstance(output, AsyncIterator)
                      else _count(output, scrape))
        await self._handle_output(output, request, response)

    async def _one_output(self, output: Any, response: Response | Failure) -> None:
        scrape = current_scrape()
        if scrape is None:
            await self._process_output(output, response)
            return
        mark = Output(scrape, output)
        token = CURRENT_OUTPUT.set(mark)
        try:
            await self._process_output(output, response)
        finally:
            CURRENT_OUTPUT.reset(token)
        # (not through when it raised: Scrapy's Deferred ends that scrape)
        mark.done()

    def give_up(self, task: ExecTask, reason: str) -> bool:
        """``task``, given up on while it waited, fails for good without a download: its request
        goes to the scraper with :class:`TaskGivenUp` as after a failed download, so its
        errback runs as usual (items, yielded requests). False: no errback to run."""
        if not task.errback:
            return False
        try:
            request = task_to_request(task, self.crawler.spider)
        except TaskError:  # its errback is gone from the spider: dead-lettered as it is
            return False
        self._enqueue_scrape(Failure(TaskGivenUp(reason)), request).addErrback(
            self._not_scraped, request)
        return True

    def _not_scraped(self, failure: Failure, request: Request) -> None:
        # (the scraper is closing: its task was settled by _finished all the same)
        logger.error("Could not hand the final failure of %s to the scraper: %s", request,
                     failure.getErrorMessage())

    def _finished(self, passthrough: Any, result: Response | Failure, request: Request,
                  scrape: Scrape | None = None) -> Any:
        if isinstance(passthrough, Failure) and scrape is not None:
            # Scrapy's scraper failed, not the spider (or it is closing): delivered again.
            _fail(scrape, "scraper error", passthrough, transient=True)
        self._pump.finished(request, result, scrape)
        return passthrough

    def _on_item_error(self, item: Any, response: Response, spider: Spider,
                       failure: Failure) -> None:
        _fail_scrape("item not committed", failure)

    def _on_spider_error(self, failure: Failure, response: Response, spider: Spider) -> None:
        _fail_scrape("callback error", failure)


def _count(output: Iterable[Any], scrape: Scrape) -> Iterable[Any]:
    for one in output:
        scrape.output_yielded()
        yield one
    scrape.output_exhausted()  # (not reached when the callback raised)


async def _count_async(output: AsyncIterator[Any], scrape: Scrape) -> AsyncIterator[Any]:
    async for one in output:
        scrape.output_yielded()
        yield one
    scrape.output_exhausted()


def _fail_scrape(what: str, failure: Failure) -> None:
    """Mark the scrape in progress (if any) failed: its task is not acked (delivered again
    when the error may pass, else dead-lettered: :func:`.fate.after_scrape`)."""
    scrape = current_scrape()
    if scrape is not None:
        _fail(scrape, what, failure, transient=fate.transient(failure.value))


def _fail(scrape: Scrape, what: str, failure: Failure, *, transient: bool) -> None:
    scrape.fail(f"{what}: {type(failure.value).__name__}: {failure.getErrorMessage()}"
                f"{_where(failure)}", transient=transient)


def _where(failure: Failure) -> str:
    """The innermost frames of ``failure``'s traceback (the spider's code), one a line."""
    frames = failure.frames[-TRACEBACK_FRAMES:]
    return "".join(f"\n  File \"{file}\", line {line}, in {function}"
                   for function, file, line, *_ in frames)

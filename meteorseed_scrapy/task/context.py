"""Which task (and which scrape of it) the code running now works for.

The worker's scrape wrapper (:mod:`meteorseed_scrapy.worker.scrapes`) sets
:data:`CURRENT_SCRAPE` around ``Scraper.enqueue_scrape``; the asyncio tasks that Scrapy creates
there (callback output, item pipelines, item signals) inherit it, so the store stage knows the
task of each item without Scrapy passing the response along. It is *not* a way to tell
retry/redirect hops from child requests: the context also leaks into downloads started from a
scrape pass.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import InitVar, dataclass, field
from typing import Any

from itemadapter import ItemAdapter, is_item

from meteorseed_scrapy.task.exec_task import ExecTask

TASK_META_KEY = "meteorseed_task"
LEASE_META_KEY = "meteorseed_lease"  # the concurrency lease a request was dispatched with


@dataclass(eq=False)
class Scrape:
    """One final hop of one task: what its callback produced and what was committed."""

    task: ExecTask
    committed: int = 0
    keyless_items: int = 0  # keyless items that reached the store stage
    keyless_yielded: int = 0  # keyless items the callback yielded (see Output.keyless_position)
    anomalies: int = 0  # items kept as anomalies (sites/pipeline.py), counted in its progress
    bytes: int = 0  # the final response's body size, counted in its seed's progress
    #: Requests its callback yielded, those kept and those dropped over the task's cap
    #: (worker/children_cap.py).
    children_yielded: int = 0
    children_dropped: int = 0
    errors: list[str] = field(default_factory=list)
    lasting: bool = False  # one of the errors would happen again if the task were redelivered
    #: Entries for the items feed, one per committed document (queue/consume/items_feed.py): written
    #: with the task's ack, before it.
    feed: list[dict[str, str]] = field(default_factory=list)
    _digest: Any = field(default_factory=hashlib.sha256)
    # What the callback yielded and is not yet through (see Output), whether it yielded its
    # last, and who to tell once both say the scrape is over.
    _open: int = 0
    _exhausted: bool = False
    _on_done: Callable[[], None] | None = None

    def record_commit(self, doc_id: str, content: str) -> None:
        """Called by the store stage once a document is durably written."""
        self.committed += 1
        self._digest.update(doc_id.encode("utf-8"))
        self._digest.update(b"\0")
        self._digest.update(content.encode("utf-8"))
        self._digest.update(b"\0")

    def fail(self, reason: str, *, transient: bool = False) -> None:
        """Record an error: the task is not acked. ``transient``: one that may pass (the store
        unreachable), else one that a redelivery would meet again (a bug in the spider)."""
        self.errors.append(reason)
        self.lasting = self.lasting or not transient

    # -- the end of a scrape, known before Scrapy's own bookkeeping of it ends ----------------
    # Scrapy fires a scrape's Deferred several turns of a busy event loop after its last item
    # was committed (item signals, the parallel workers' end, Deferred/Future bridges): a few
    # milliseconds every task waited before its ack. Counting the callback's output here says
    # when the scrape is over as soon as it is.

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, as soon as the callback's output ran out and every output
        is through (an item committed or out of the item pipelines, a request scheduled),
        with no error. Never called when one of those is not known (the scrape's end then
        comes from Scrapy's own Deferred)."""
        self._on_done = callback

    def output_yielded(self) -> None:
        self._open += 1

    def output_exhausted(self) -> None:
        """The callback's output ended without an error."""
        self._exhausted = True
        self._check_done()

    def output_through(self) -> None:
        self._open -= 1
        self._check_done()

    def _check_done(self) -> None:
        if self._exhausted and self._open == 0 and not self.errors and self._on_done:
            done, self._on_done = self._on_done, None
            done()

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()


@dataclass(eq=False)
class Output:
    """One thing a scrape's callback yielded, while Scrapy's scraper handles it. Through once:
    when the store stage (the last item stage) committed it, or when the scraper is done
    with it, whichever comes first."""

    scrape: Scrape
    value: InitVar[Any] = None  # what was yielded
    through: bool = False
    #: Its place among the items without ``unique_key`` that the callback yielded, in the
    #: order yielded (Scrapy starts handling outputs in that order): the part of a keyless
    #: item's identity that a redelivered task gives again.
    keyless_position: int | None = None

    def __post_init__(self, value: Any) -> None:
        # (a plain dict, the commonest item, without itemadapter's search for its adapter)
        keyless = ("unique_key" not in value if type(value) is dict
                   else is_item(value) and "unique_key" not in ItemAdapter(value))
        if keyless:
            self.keyless_position = self.scrape.keyless_yielded
            self.scrape.keyless_yielded += 1

    def done(self) -> None:
        if not self.through:
            self.through = True
            self.scrape.output_through()


CURRENT_SCRAPE: ContextVar[Scrape | None] = ContextVar("meteorseed_current_scrape", default=None)
CURRENT_OUTPUT: ContextVar[Output | None] = ContextVar("meteorseed_current_output", default=None)


def current_scrape() -> Scrape | None:
    return CURRENT_SCRAPE.get()


def current_output() -> Output | None:
    """The callback output the code running now handles (the store stage: its item)."""
    return CURRENT_OUTPUT.get()


def task_of(obj: Any) -> ExecTask | None:
    """The task carried by a Request, Response or Failure (via ``request.meta``), if any."""
    request = getattr(obj, "request", obj)
    meta = getattr(request, "meta", None)
    if meta is None:
        value = getattr(obj, "value", None)  # a Failure whose exception carries the request
        meta = getattr(getattr(value, "request", None), "meta", None)
    task = meta.get(TASK_META_KEY) if meta else None
    return task if isinstance(task, ExecTask) else None

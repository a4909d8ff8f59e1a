"""What a busy worker changes in its Python interpreter while it runs, and gives back after.

- ``METEORSEED_FREEZE_GC``: ``gc.freeze()`` once the crawl has started, so long-lived start-up
  objects stay out of the collector's way (measured as the main cost of a busy worker).
- ``METEORSEED_SWITCH_INTERVAL``: the interpreter's thread switch interval. The store and
  keep-alive threads wait for the GIL whenever the reactor's thread is busy, which on a loaded
  worker is always: with Python's 5 ms, each of their steps back from I/O waits up to 5 ms, and
  an item's commit takes a few such steps before its task may be acked. A thread that wants the
  GIL gets it this fast instead; a worker with no other thread pays nothing, since the switch
  is only forced when one waits. 0 leaves Python's own.
- ``METEORSEED_GC_THRESHOLD``: the young generation's collection threshold (net allocations of
  container objects between collections; Python's is 700). A page's scrape leaves cycles behind
  (Twisted's and Scrapy's), and with Python's threshold a busy worker ran a young collection
  every few tasks and promoted what was still in flight into the older generations, whose
  collections then cost the most: 10,000 halved the collector's time (docs/capacity.md).
  0 leaves Python's own.
"""

from __future__ import annotations

import gc
import logging
import sys
from typing import TYPE_CHECKING

from meteorseed_scrapy.settings import flag_setting, integer_setting, number_setting

if TYPE_CHECKING:
    from meteorseed_scrapy.settings import SettingsSource

logger = logging.getLogger(__name__)


class InterpreterTuning:
    def __init__(self, freeze_gc: bool, switch_interval: float, gc_threshold: int) -> None:
        self.freeze_gc = freeze_gc
        self.switch_interval = switch_interval
        self.gc_threshold = gc_threshold
        self._saved_interval: float | None = None
        self._saved_threshold: tuple[int, int, int] | None = None

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> InterpreterTuning:
        return cls(flag_setting(settings, "METEORSEED_FREEZE_GC"),
                   number_setting(settings, "METEORSEED_SWITCH_INTERVAL", maximum=0.1),
                   integer_setting(settings, "METEORSEED_GC_THRESHOLD", maximum=1_000_000))

    def started(self) -> None:
        """The crawl has started: apply."""
        if self.freeze_gc:
            gc.collect()
            gc.freeze()
        if self.gc_threshold > 0 and self._saved_threshold is None:
            self._saved_threshold = gc.get_threshold()
            gc.set_threshold(self.gc_threshold, *self._saved_threshold[1:])
        if self.switch_interval > 0 and self._saved_interval is None:
            self._saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.switch_interval)
            logger.debug("Thread switch interval %.4f s (was %.4f s)", self.switch_interval,
                         self._saved_interval)

    def stopped(self) -> None:
        """The worker stops: give the interpreter back its switch interval and collection
        threshold (frozen objects stay frozen: unfreezing them would only make the next
        collections longer)."""
        if self._saved_threshold is not None:
            gc.set_threshold(*self._saved_threshold)
            self._saved_threshold = None
        if self._saved_interval is not None:
            sys.setswitchinterval(self._saved_interval)
            self._saved_interval = None

"""``DUPEFILTER_CLASS`` honoured around the fleet-wide dedup of yielded requests.

Requests a spider yields are deduplicated when their tasks are written (in Lua, fleet-wide, by
the dedup keys of ``queue/enqueue/dedup.py``). A duplicate is then reported as Scrapy's scheduler
reports one its dupefilter filtered: the dupefilter's ``log()`` (``RFPDupeFilter``: the first
"Filtered duplicate request: …" line, every one with ``DUPEFILTER_DEBUG``, and the
``dupefilter/filtered`` stat) and the ``request_dropped`` signal. What the setting names:

- Scrapy's ``RFPDupeFilter`` (the default): the fleet-wide dedup alone.
- ``BaseDupeFilter``: no dedup at all (every request is written, as with ``dont_filter``).
- any other class: its ``request_seen()`` first, in this worker (a request it has seen is
  dropped there, as on stock Scrapy), then the fleet-wide dedup; its ``log()`` reports both.
- scrapy-redis's dupefilters: refused (they would keep a second, pickled fingerprint set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import Request, signals
from scrapy.dupefilters import BaseDupeFilter, RFPDupeFilter
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.python import global_object_name

from meteorseed_scrapy.validators import ConfigError

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

SETTING = "DUPEFILTER_CLASS"


class Duplicates:
    def __init__(self, crawler: Crawler, spider: Spider | None) -> None:
        self._signals = crawler.signals
        # None only for a pump built without a spider (tests); Scrapy's dupefilters put it
        # in the log record's extra alone.
        self._spider = spider
        cls = load_object(crawler.settings.get(SETTING))
        name = global_object_name(cls)
        if name.startswith("scrapy_redis."):
            raise ConfigError(SETTING, f"{name} is scrapy-redis's: remove the setting "
                                       "(MeteorSeed deduplicates requests fleet-wide itself)")
        #: Requests are deduplicated fleet-wide (unless ``dont_filter``).
        self.fleet = cls is not BaseDupeFilter
        self._local: BaseDupeFilter | None = None
        self._reporter: BaseDupeFilter | None = None
        if cls not in (BaseDupeFilter, RFPDupeFilter):
            self._local = self._reporter = build_from_crawler(cls, crawler)
        elif self.fleet:
            self._reporter = build_from_crawler(RFPDupeFilter, crawler)

    def open(self) -> None:
        if self._local is not None:
            self._local.open()

    def close(self, reason: str) -> None:
        if self._local is not None:
            self._local.close(reason)

    def dedup(self, request: Request) -> bool:
        """Whether ``request``'s task is deduplicated fleet-wide when written."""
        return self.fleet and not request.dont_filter

    def seen_here(self, request: Request) -> bool:
        """The project's own dupefilter says ``request`` is a duplicate: logged, to be dropped
        (the engine then sends ``request_dropped``)."""
        if self._local is None or request.dont_filter or not self._local.request_seen(request):
            return False
        self._local.log(request, self._spider)  # type: ignore[arg-type]  # see _spider
        return True

    def dropped(self, request: Request) -> None:
        """``request`` was found a duplicate when written: reported as Scrapy reports one."""
        if self._reporter is not None:
            self._reporter.log(request, self._spider)  # type: ignore[arg-type]  # see _spider
        self._signals.send_catch_log(signals.request_dropped, request=request,
                                     spider=self._spider)


__all__ = ["Duplicates"]

"""The probe spider with an errback that counts its calls and handles failures when asked."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from probe.spiders.probe import ProbeSpider


class ErrbackProbeSpider(ProbeSpider):
    name = "errback_probe"

    def on_error(self, failure: Any) -> Any:
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("probe/errback")
        self.crawler.stats.inc_value(f"probe/errback/{type(failure.value).__name__}")
        parsed = urlparse(failure.request.url)
        if "raise" in parsed.query:  # a bug in the errback
            raise RuntimeError(f"errback bug at {parsed.path}")
        if "handle" in parsed.query:  # handled: an item of its own, the task is done
            yield {"unique_key": f"errback:{parsed.path}", "title": None, "status": 0}

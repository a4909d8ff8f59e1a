"""Item stages the tests put before or after the store stage."""

from __future__ import annotations

from typing import Any

from scrapy.exceptions import DropItem


class DropOdd:
    """Drops the items whose ``unique_key`` ends in an odd number (``...#3``)."""

    def process_item(self, item: Any) -> Any:
        if int(str(item.get("unique_key", "0")).rsplit("#", 1)[-1] or 0) % 2:
            raise DropItem("odd")
        return item


class Passthrough:
    """Does nothing; behind the store stage, it makes the store stage not the last."""

    def process_item(self, item: Any) -> Any:
        return item


class FailSecond:
    """Raises (a bug in a pipeline) for the second item of pages with ``pipefail`` in their
    query (``unique_key`` ``...pipefail...#1``)."""

    def process_item(self, item: Any) -> Any:
        key = str(item.get("unique_key", ""))
        if "pipefail" in key and key.endswith("#1"):
            raise ValueError(f"pipeline bug at {key}")
        return item

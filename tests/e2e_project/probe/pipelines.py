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

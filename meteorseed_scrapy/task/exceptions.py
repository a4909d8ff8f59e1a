"""Exceptions that carry a task's fate through Scrapy's request/response machinery."""

from __future__ import annotations

from scrapy.exceptions import IgnoreRequest


class TaskDeferred(IgnoreRequest):
    """Put the task back for later, durably (the delayed set), instead of processing it now.

    ``count_retry``: a 5xx or a timeout uses up one of the task's retries; a pause (429) or an
    open breaker does not.
    """

    def __init__(self, delay_s: float, reason: str, *, count_retry: bool) -> None:
        super().__init__(f"deferred {delay_s:.1f}s: {reason}")
        self.delay_s = delay_s
        self.reason = reason
        self.count_retry = count_retry

"""Exceptions that carry a task's fate through Scrapy's request/response machinery."""

from __future__ import annotations

from enum import Enum

from scrapy.exceptions import IgnoreRequest


class DeferReason(str, Enum):
    """Why a task waits in the delayed set (recorded with it: ``meteorseed status`` shows it).

    A str whose str() and format() are its value, as ``enum.StrEnum`` (3.11+) gives; spelt out
    here because Python 3.10 is supported."""

    __str__ = str.__str__

    RETRY = "retry"  # a 5xx or a timeout: its retry waits out the backoff
    PAUSED = "paused"  # its site is paused after a 429/403, or far behind its rate quota
    SICK = "sick"  # its site's breaker is open (or the site looks down): no retry used up
    PRIORITY = "priority"  # parked: a sick site's scarce permits go to higher priorities first
    QUOTA = "quota"  # parked: more tasks than the site's rate serves in the next seconds
    OTHER = "other"  # deferred without a reason given


class TaskDeferred(IgnoreRequest):
    """Put the task back for later, durably (the delayed set), instead of processing it now.

    ``count_retry``: a 5xx or a timeout uses up one of the task's retries; a pause (429) or an
    open breaker does not. ``why`` is recorded in the delayed set (default: ``RETRY`` when a
    retry is used up, else ``OTHER``).
    """

    def __init__(self, delay_s: float, reason: str, *, count_retry: bool,
                 why: DeferReason | None = None) -> None:
        super().__init__(f"deferred {delay_s:.1f}s: {reason}")
        self.delay_s = delay_s
        self.reason = reason
        self.count_retry = count_retry
        self.why = why or (DeferReason.RETRY if count_retry else DeferReason.OTHER)


#: How an ignored task's reason starts: its IgnoreRequest's message follows.
IGNORED_PREFIX = "ignored: "
#: The message of Scrapy's RobotsTxtMiddleware refusing a request.
ROBOTS_MESSAGE = "Forbidden by robots.txt"


class Blacklisted(IgnoreRequest):
    """A site's blacklist refused the request (``detail``: the pattern, and why if it ran out
    of time); its message starts with :attr:`PREFIX` and the site."""

    PREFIX = "blacklisted by site "

    def __init__(self, site: str, detail: str) -> None:
        super().__init__(f"{self.PREFIX}{site}: {detail}")


class TaskGivenUp(Exception):
    """The task's final failure when its site stayed in trouble for ``METEORSEED_GIVE_UP_AFTER``:
    what its errback sees (once, as for any final failure); it is then dead-lettered with
    ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

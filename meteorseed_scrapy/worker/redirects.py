"""A task ending in too many redirects (a loop, or a chain longer than ``REDIRECT_MAX_TIMES``).

Scrapy's ``RedirectMiddleware`` discards such a request with ``IgnoreRequest("max redirections
reached")`` and a DEBUG line: the task would end ``ignored`` with nothing at the default log
level naming it. For a worker that is a page given up on for good, so it is said at WARNING
(as Scrapy says a request it gave up retrying), naming the task's URL, the redirect count and
whether it loops, and the reason is kept for its completion record.
"""

from __future__ import annotations

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.python.failure import Failure

STAT = "meteorseed/redirects/too_many"


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


__all__ = ["STAT", "too_many_redirects"]

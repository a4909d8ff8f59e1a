"""Task lanes and priority bands: where in the streams a task waits, by kind and priority."""

from __future__ import annotations

#: Task lanes in the order a worker prefers them (ties of the weighted read go to the first).
LANES = ("realtime", "scheduled", "retry")
DEFAULT_LANE = "scheduled"
RETRY_LANE = "retry"
#: Priority bands within a lane, read strictly in this order.
BANDS = ("high", "normal", "low")


def band_of(priority: int) -> str:
    """A task's band: Scrapy's convention, a higher priority goes first."""
    return "high" if priority > 0 else "low" if priority < 0 else "normal"

"""The one exponential backoff: ``first * 2**attempt``, at least ``floor``, at most ``cap``,
times a random factor drawn from ``jitter`` (so retries of many workers spread out).

Every wait that grows with failures uses it: Redis outages (``worker/loops.py``), a site's
backoff after 429/403 (``politeness/policy.py``), a failing per-site call
(``politeness/site_errors.py``), store retries (``store/outage.py``), SQLite's transient
errors (``store/sqlite.py``) and a failing seed's next run (``seeding/adapt.py``). One more is
in Lua: a site's fleet-wide pause after 429/403 (``lua/pause.lua``), whose strike count lives
in Redis (its random part is drawn by its caller, ``politeness/gate.py``).
"""

from __future__ import annotations

import random

#: Doubling stops here: any cap is reached long before, and 2.0**1024 would overflow.
MAX_DOUBLINGS = 60


def exponential(attempt: int, first: float, cap: float, *, floor: float | None = None,
                jitter: tuple[float, float] = (1.0, 1.0)) -> float:
    """Seconds to wait before retry number ``attempt`` (0 = the first retry waits ``first``)."""
    delay = first * 2.0 ** max(0, min(attempt, MAX_DOUBLINGS))
    if floor is not None:
        delay = max(delay, floor)
    delay = min(cap, delay)
    low, high = jitter
    return delay * (random.uniform(low, high) if low != high else low)


__all__ = ["MAX_DOUBLINGS", "exponential"]

"""An operator's hand on a site, fleet-wide: hold it (pause), let it go (resume), or set its
rate and concurrency now, without editing its rule file, until reset.

- **Hold.** ``<ns>:{<site>}:hold`` present: ``gate.lua`` grants no permit for the site and tells
  the worker to ask again in :data:`HOLD_RECHECK_S`; the worker parks the site's tasks in the
  delayed set meanwhile (reason ``paused``). Nothing is fetched, nothing is lost: waiting tasks
  stay, in-flight requests finish. Every worker sees it at its next permit request (they ask
  at least twice a second while they have the site's tasks).
- **Resume.** The marker goes, and the site's parked tasks are made due now, and again 1 s and
  3 s later (a scan of the delayed sets per pass, as a seed's resume: ``wake_parked``): a
  worker refused just before the marker went parks its tasks a moment later, and its parking
  reaches Redis with its next writes. A worker whose refusal is over ``STALE_VIEW_S`` (1 s)
  old when it parks (its loop was blocked, Redis slow) parks them for ``STALE_PARK_S`` (5 s)
  only (``PermitDesk.park_wait``), so a resume whose passes it missed delays nothing long.
- **Limit.** ``<ns>:{<site>}:override`` (``rate``, ``concurrency``) replaces the site's own in
  ``gate.lua`` (its burst then at most the rate) until :func:`unlimit`.

Each action is indexed (``<ns>:held``, ``<ns>:overrides``: who, when, why), appended to the
namespace's event stream (``<ns>:events``) and logged. Keys go in the site's quota slot on a
cluster (:meth:`KeyLayout.site_own`), so callers pass the site's quota key (its rule file's
``limits.quota_key``, else the site itself).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.consume.delayed_set import wake_parked
from meteorseed_scrapy.queue.fleet import events
from meteorseed_scrapy.queue.fleet.delayed import site_of
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.replies import record_of, text_of
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.validation import TaskError, check_id

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis

logger = logging.getLogger(__name__)

#: The per-site keys gate.lua reads after its others: the hold marker and the override.
HOLD_KEYS = ("hold", "override")
#: A held site's worker asks for permits again after this long (its parked tasks come back
#: then, or at once on resume).
HOLD_RECHECK_S = 3600.0


@dataclass(frozen=True)
class SiteRef:
    """A site as an operator names it, with the quota its politeness keys live under."""

    site: str
    quota: str = ""

    def __post_init__(self) -> None:
        try:
            check_id("site_id", self.site)
            if self.quota:
                check_id("quota_key", self.quota)
        except TaskError as exc:
            raise ValueError(str(exc)) from None

    def key(self, keys: KeyLayout, what: str) -> str:
        return keys.site_own(self.site, self.quota or self.site, what)


def _event(client: SyncRedis, keys: KeyLayout, event: str, site: str, by: str,
           **fields: Any) -> None:
    events.append(client, keys.events, event, site=site, by=by, **fields)
    logger.info("%s %s by %s%s", event.capitalize(), site, by,
                "".join(f"; {k} {v}" for k, v in fields.items() if v is not None))


def hold(client: SyncRedis, keys: KeyLayout, ref: SiteRef, by: str, reason: str = "") -> bool:
    """Hold the site fleet-wide; False when it was held already (the first hold stays)."""
    record = json.dumps({"by": by, "at": time.time(), "reason": reason})
    if not client.set(ref.key(keys, "hold"), record, nx=True):
        return False
    client.hset(keys.held, ref.site, record)
    _event(client, keys, "site paused", ref.site, by, reason=reason or None)
    return True


def release(client: SyncRedis, keys: KeyLayout, ref: SiteRef, by: str) -> int | None:
    """Resume a held site: its parked tasks due now (the call takes the passes' 3 s). Returns
    how many were made due (None when it was not held)."""
    held = client.delete(ref.key(keys, "hold"))
    client.hdel(keys.held, ref.site)
    if not held:
        return None
    def parked_here(member: Any) -> bool:
        return site_of(member) == ref.site

    woken = wake_parked(client, keys, DeferReason.PAUSED, parked_here)
    _event(client, keys, "site resumed", ref.site, by, woken=woken)
    return woken


def limit(client: SyncRedis, keys: KeyLayout, ref: SiteRef, by: str, *,
          rate: float | None = None, concurrency: int | None = None) -> None:
    """Set the site's rate (requests/s) and/or concurrency fleet-wide until :func:`unlimit`."""
    if rate is None and concurrency is None:
        raise ValueError("limit: give a rate, a concurrency or both")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate: a number of requests a second above 0, got {rate!r}")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency: at least 1, got {concurrency!r}")
    values = {k: v for k, v in (("rate", rate), ("concurrency", concurrency)) if v is not None}
    client.hset(ref.key(keys, "override"), mapping=values)  # type: ignore[arg-type]
    client.hset(keys.overrides, ref.site, json.dumps({**values, "by": by, "at": time.time()}))
    _event(client, keys, "site limited", ref.site, by, **values)


def unlimit(client: SyncRedis, keys: KeyLayout, ref: SiteRef, by: str) -> bool:
    """Back to the site's own limits; False when none were overridden."""
    gone = client.delete(ref.key(keys, "override"))
    client.hdel(keys.overrides, ref.site)
    if gone:
        _event(client, keys, "site limits reset", ref.site, by)
    return bool(gone)


def controls(client: SyncRedis, keys: KeyLayout) -> dict[str, dict[str, Any]]:
    """Per site: ``held`` and ``override`` records (who, when, why; the values)."""
    out: dict[str, dict[str, Any]] = {}
    for what, key in (("held", keys.held), ("override", keys.overrides)):
        for site, raw in client.hgetall(key).items():
            out.setdefault(text_of(site), {})[what] = record_of(raw)
    return out

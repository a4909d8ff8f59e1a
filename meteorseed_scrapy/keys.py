"""The whole Redis key layout, in one place.

Every key starts with the namespace and a colon. Keys that a future Redis Cluster deployment must
keep together (a site's dedup set and its quota, for instance) will carry a hash tag right after
the namespace: ``<ns>:{site}:...``.

==================================  ======  ===================================================
key                                 type    holds
==================================  ======  ===================================================
``<ns>:tasks``                      stream  exec tasks (fields ``v``, ``t``) of the scheduled
                                            lane, normal band; consumer group ``workers``. An
                                            entry is XDEL'd only after XACK, so XLEN = tasks
                                            waiting + tasks pending. The name predates lanes:
                                            older namespaces and migrations keep working.
``<ns>:tasks:<lane>:<band>``        stream  the other task streams, same fields and group:
                                            lane ``realtime``/``scheduled``/``retry`` times band
                                            ``high``/``normal``/``low`` (from the task's
                                            ``priority``: > 0, 0, < 0), except scheduled/normal
                                            which is ``<ns>:tasks``. Workers read them weighted
                                            by lane (``METEORSEED_LANE_WEIGHTS``), bands strictly
                                            in order; see ``docs/lanes.md``.
``<ns>:dead``                       stream  dead letters: ``t`` (original message or raw fields),
                                            ``reason``, ``source_id``, ``consumer``, ``at``,
                                            ``deliveries``
``<ns>:seen:{<site_id>}``           hash    the site's URL dedup root (fleet-wide dedup;
                                            a dead-lettered URL is released): ``w`` = re-crawl
                                            window in seconds (0 = never). Its generations
                                            ``<root>:<w>:<g>`` (g = now // w, 0 when w = 0;
                                            expire at (g + 2) * w + 60 s) hold: the generation
                                            (hash: n, b, p, s, f), ``<gen>:f<i>`` Bloom slices
                                            (strings, blocked Bloom, 10 bits/URL, doubling)
                                            and ``<gen>:<j>`` exact buckets (small listpack
                                            hashes: 6-byte fingerprint prefix -> time slot,
                                            linear hashing, ~40 entries). See
                                            ``lua/dedup_lib.lua`` and ``docs/dedup.md``.
``<ns>:done:<task_id>``             string  completion record (JSON: outcome, items, digest,
                                            status, at), written once a task's items are
                                            committed and its children durable, just before
                                            its ack; a redelivery of it is acked without a
                                            refetch. Expires after ``METEORSEED_DONE_TTL``.
``<ns>:delayed``                    zset    deferred tasks (``<lane>:<band>|<message JSON>``
                                            -> due time, ms): durable retries with backoff (to
                                            the retry lane), tasks of paused sites (to their own
                                            lane); moved into that task stream when due. A bare
                                            JSON member (older versions) goes to ``<ns>:tasks``.
``<ns>:{<site>}:bucket``            hash    the site's token bucket (tokens, ts in Redis TIME
                                            ms); the rate quota shared by every worker
``<ns>:{<site>}:leases``            zset    concurrency leases (lease id -> expiry ms), one per
                                            request in flight to the site, fleet-wide;
                                            renewed while in flight, expire with dead workers
``<ns>:{<site>}:pause``             string  present (with a PX expiry) while the site is paused
                                            after a 429/403
``<ns>:{<site>}:strikes``           string  consecutive 429/403s (the backoff exponent)
``<ns>:{<site>}:tighten``           string  rate factor (< 1) for a while after a 429/403
                                            (bucket, leases, pause, strikes and tighten are
                                            keyed by the site's ``limits.quota_key`` instead
                                            when its rule config names one: the sites of one
                                            host share them; breaker, probe and health stay
                                            the site's own)
``<ns>:failed:<task_id>``           string  why the task's last delivery failed (callback or
                                            store error); quoted in its dead letter when it
                                            keeps failing. Expires after ``METEORSEED_DONE_TTL``.
``<ns>:{<site>}:fp:<sha1>``         string  content fingerprint of an article (title + start of
                                            content, :mod:`meteorseed_scrapy.sites.fingerprint`)
                                            -> id of the first document seen with it; reposts
                                            under other URLs get ``duplicate_of`` it. Expires
                                            after the site's dedup window (default 30 days).
``<ns>:seeds``                      zset    the seed registry's index: every seed_id, score 0
                                            (lexical order: paging, ZCARD = count)
``<ns>:seeds:by_site``              zset    ``<site_id>\t<seed_id>``, score 0: a site's seeds
                                            by ZRANGEBYLEX (site ids hold no whitespace)
``<ns>:seed:<seed_id>``             hash    one seed: ``def`` (its JSON line, canonical),
                                            ``site``, ``sched`` (schedule JSON), ``rev``,
                                            ``added_at``/``updated_at`` and run state
                                            (``last_run``, ``last_success``, ``last_error``,
                                            ``last_yield``, ``runs``, ``failures``,
                                            ``interval_s``, ``rate``, ...); see
                                            :mod:`meteorseed_scrapy.seeding.registry`
``<ns>:seeds:due``                  zset    seed_id -> due time (epoch s, Redis TIME). A
                                            claimed seed's score is its lease expiry, so two
                                            seeders never run one seed at once
                                            (``lua/seed_claim.lua``); absent = not scheduled
``<ns>:seeds:yield``                hash    seed_id -> new child URLs counted by workers since
                                            the seed's last run (``SeedRegistry.add_yield``);
                                            taken by the next ``record_run``
``<ns>:sites``                      hash    site rule files pushed by ``meteorseed sites push``:
                                            site_id -> JSON (``source`` file name, ``text``,
                                            ``version``, ``sha1``, ``pushed_at``); see
                                            :mod:`meteorseed_scrapy.sites.remote`
``<ns>:sites:rev``                  string  bumped with every change of ``<ns>:sites`` (workers
                                            poll it: one GET while nothing changed)
==================================  ======  ===================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

GROUP = "workers"
#: Task lanes in the order a worker prefers them (ties of the weighted read go to the first).
LANES = ("realtime", "scheduled", "retry")
DEFAULT_LANE = "scheduled"
RETRY_LANE = "retry"
#: Priority bands within a lane, read strictly in this order.
BANDS = ("high", "normal", "low")


def band_of(priority: int) -> str:
    """A task's band: Scrapy's convention, a higher priority goes first."""
    return "high" if priority > 0 else "low" if priority < 0 else "normal"


@dataclass(frozen=True)
class KeyLayout:
    namespace: str = "meteorseed"

    def __post_init__(self) -> None:
        if not self.namespace or any(c in self.namespace for c in " {}\n"):
            raise ValueError(f"METEORSEED_NAMESPACE: invalid namespace {self.namespace!r}")

    @property
    def group(self) -> str:
        return GROUP

    @property
    def stream(self) -> str:
        return f"{self.namespace}:tasks"

    def task_stream(self, lane: str, band: str) -> str:
        """The stream of one lane and band (``<ns>:tasks`` for scheduled/normal)."""
        if lane not in LANES or band not in BANDS:
            raise ValueError(f"no task stream for lane {lane!r}, band {band!r}")
        if lane == DEFAULT_LANE and band == "normal":
            return self.stream
        # Named after the main stream, so a layout that hash-tags it (a shard, a test on a
        # Redis Cluster) keeps all its lanes in that one slot.
        return f"{self.stream}:{lane}:{band}"

    @cached_property
    def streams(self) -> tuple[str, ...]:
        """Every task stream, lane by lane in :data:`LANES` order, bands in :data:`BANDS` order."""
        return tuple(self.task_stream(lane, band) for lane in LANES for band in BANDS)

    @cached_property
    def stream_lanes(self) -> dict[str, tuple[str, str]]:
        """Task stream -> its (lane, band)."""
        return {self.task_stream(lane, band): (lane, band) for lane in LANES for band in BANDS}

    def stream_for(self, lane: str, priority: int) -> str:
        """Where a task of ``lane`` and ``priority`` waits."""
        return self.task_stream(lane, band_of(priority))

    @property
    def dead(self) -> str:
        return f"{self.namespace}:dead"

    def seen(self, site_id: str) -> str:
        """The site's dedup root; every dedup key of the site starts with it."""
        return f"{self.namespace}:seen:{{{site_id}}}"

    def done(self, task_id: str) -> str:
        return f"{self.namespace}:done:{task_id}"

    @property
    def delayed(self) -> str:
        return f"{self.namespace}:delayed"

    def site(self, site: str, what: str) -> str:
        """A per-site politeness key (``bucket``, ``leases``, ``pause``, ...), hash-tagged."""
        return f"{self.namespace}:{{{site}}}:{what}"

    def failed(self, task_id: str) -> str:
        return f"{self.namespace}:failed:{task_id}"

    def fingerprint(self, site_id: str, fp: str) -> str:
        return f"{self.namespace}:{{{site_id}}}:fp:{fp}"

    @property
    def pattern(self) -> str:
        """Glob matching every key of the namespace (for ``reset`` and tests)."""
        return f"{self.namespace}:*"

    # -- seed registry (meteorseed_scrapy.seeding.registry) --------------------------------------

    @property
    def seeds(self) -> str:
        """Index of every registered seed_id (zset, score 0, lexical order)."""
        return f"{self.namespace}:seeds"

    @property
    def seeds_by_site(self) -> str:
        return f"{self.namespace}:seeds:by_site"

    def seed(self, seed_id: str) -> str:
        """One seed's definition and run state (hash)."""
        return f"{self.namespace}:seed:{seed_id}"

    @property
    def seeds_due(self) -> str:
        return f"{self.namespace}:seeds:due"

    @property
    def seeds_yield(self) -> str:
        return f"{self.namespace}:seeds:yield"

    # -- site rules pushed to Redis (meteorseed_scrapy.sites.remote) ----------------------------

    @property
    def sites(self) -> str:
        return f"{self.namespace}:sites"

    @property
    def sites_rev(self) -> str:
        return f"{self.namespace}:sites:rev"

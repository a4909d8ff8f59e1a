"""The whole Redis key layout, in one place.

Every key starts with the namespace and a colon; a Redis Cluster hash tag, where needed, comes
right after it (``<ns>:{site}:...``). With ``METEORSEED_STREAM_SHARDS`` > 1, or on any
``redis+cluster://`` URL, the keys one task's life touches in one script (task streams, dead
letters, delayed set, completion record, failure note, its site's dedup root) belong to the shard
of its site (``k = crc32(site_id) % shards``) and carry the shard's tag: read ``<ns>:tasks`` below
as ``<ns>:{s<k>}:tasks``, ``<ns>:dead`` as ``<ns>:{s<k>}:dead`` (on a cluster only: one Redis
keeps the one ``<ns>:dead``), ``<ns>:delayed`` as
``<ns>:{s<k>}:delayed``, ``<ns>:counts`` as ``<ns>:{s<k>}:counts``, ``<ns>:done:<id>`` as
``<ns>:{s<k>}:done:<id>``, ``<ns>:failed:<id>`` as
``<ns>:{s<k>}:failed:<id>``, ``<ns>:seen:{<site>}`` as ``<ns>:{s<k>}:seen:<site>`` and
``<ns>:hist:{<site>}`` as ``<ns>:{s<k>}:hist:<site>``
(:class:`ShardKeys`). On a cluster the seed registry's keys carry ``{seeds}``
(``<ns>:{seeds}``, ``<ns>:{seeds}:by_site``, ``<ns>:{seeds}:seed:<id>``, ``<ns>:{seeds}:due``,
``<ns>:{seeds}:yield``) and the site rules ``{sites}`` (``<ns>:{sites}``, ``<ns>:{sites}:rev``).
One shard on one Redis keeps the names below exactly. See ``docs/cluster.md``.

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
``<ns>:spider:<name>:tasks...``     stream  the task set of spider ``<name>`` (a task whose
                                            ``spider`` field names it, and its children): the
                                            same lanes and bands (``...:tasks``,
                                            ``...:tasks:<lane>:<band>``) and its own delayed
                                            set ``<ns>:spider:<name>:delayed``; read only by
                                            that spider's workers (they also read the default
                                            set, tasks naming no spider). Tagged:
                                            ``<ns>:{s<k>}:spider:<name>:...``. docs/spiders.md
``<ns>:spiders``                    set     the spider names with a task set (added by a
                                            writer before it writes one's first task)
``<ns>:spiders:workers``            hash    consumer -> its spider's name, set at a worker's
                                            start; with ``<ns>:workers``, who reads which set
``<ns>:dead``                       stream  dead letters: ``t`` (original message or raw fields),
                                            ``reason``, ``source_id``, ``consumer``, ``at``,
                                            ``deliveries``
``<ns>:seen:{<site_id>}``           hash    the site's URL dedup root (fleet-wide dedup;
                                            a dead-lettered URL is released): ``w`` = re-crawl
                                            window in seconds (0 = never). Its generations
                                            ``<root>:<w>:<g>`` (g = now // w, 0 when w = 0;
                                            expire at (g + 2) * w + 60 s) hold: the generation
                                            (hash: n, b, p) and ``<gen>:<j>`` exact buckets
                                            (small listpack hashes: 6-byte fingerprint prefix
                                            -> time slot, linear hashing, ~48 entries; no
                                            Bloom filter: docs/dedup.md says why). See
                                            ``lua/dedup_lib.lua`` and ``docs/dedup.md``.
``<ns>:done:<task_id>``             string  completion record (JSON: outcome, items, digest,
                                            status, at), written once a task's items are
                                            committed and its children durable, just before
                                            its ack; a redelivery of it is acked without a
                                            refetch. Expires after ``METEORSEED_DONE_TTL``.
``<ns>:hist:{<site_id>}``           hash    the site's task history root (``g``, ``t``, ``w``:
                                            current generation, its start, its width =
                                            retention / 4); its generations
                                            ``<root>:<w>:<g>`` and buckets ``<gen>:<j>`` are
                                            the dedup layer's, each bucket mapping a URL's
                                            6-byte fingerprint prefix to its last outcome
                                            (``d``one, ``g``one, ``r``obots, ``b``lacklist,
                                            ``x`` dead, ``c``ancelled, ...), time, items,
                                            status, consumer. Kept for
                                            ``METEORSEED_TASK_HISTORY_RETENTION``, at most
                                            ``METEORSEED_TASK_HISTORY_PER_SITE`` records per
                                            site (``lua/history_lib.lua``,
                                            :mod:`meteorseed_scrapy.queue.consume.task_history`)
``<ns>:delayed``                    zset    deferred tasks (``<lane>:<band>|<message JSON>``
                                            -> due time, ms): durable retries with backoff (to
                                            the retry lane), tasks of paused sites (to their own
                                            lane); moved into that task stream when due. A bare
                                            JSON member (older versions) goes to ``<ns>:tasks``.
                                            Why a task waits is the score's fraction, in 1/16
                                            ms (``queue/fleet/delayed.py``; none: ``unknown``).
``<ns>:counts``                     hash    ``added``: tasks ever added to the task streams
                                            (enqueue, promote, requeue scripts); status derives
                                            throughput from it (Redis 6.2 has no entries-added)
``<ns>:crawl:<seed_id>``            hash    a seed's progress (``queue/fleet/crawl_progress.py``,
                                            ``lua/progress_lib.lua``): ``enqueued``, ``done``,
                                            ``dead``, ``cancelled``, ``delayed``,
                                            ``outstanding`` (enqueued - done - dead -
                                            cancelled), ``items``, ``anomalies``, ``bytes``,
                                            ``started_at``, ``finished_at``, ``run``,
                                            ``last_<name>`` (the last run's counters);
                                            expires ``METEORSEED_SEED_PROGRESS_RETENTION``
                                            after it finished. Tagged: one per shard
                                            (``<ns>:{s<k>}:crawl:<seed_id>``), summed on read.
                                            Tasks with no usable seed_id: ``<ns>:crawl:``
``<ns>:crawlsite:<site_id>``        hash    the same totals per site (no finished state)
``<ns>:{<site>}:bucket``            hash    the site's token bucket (tokens, ts in Redis TIME
                                            ms); the rate quota shared by every worker
``<ns>:{<site>}:leases``            zset    concurrency leases (lease id -> expiry ms), one per
                                            request in flight to the site, fleet-wide;
                                            renewed while in flight, expire with dead workers
``<ns>:{<site>}:pause``             string  present (with a PX expiry) while the site is paused
                                            after a 429/403
``<ns>:{<site>}:hold``              string  present while an operator holds the site
                                            (``meteorseed sites pause``): no permit is granted
``<ns>:{<site>}:override``          hash    ``rate``, ``concurrency`` an operator set
                                            (``meteorseed sites limit``): they replace the
                                            site's own until reset
``<ns>:held`` / ``<ns>:overrides``  hash    site -> JSON (who, when, why): the index of the two
                                            above, for listing (:mod:`~meteorseed_scrapy.
                                            politeness.control`)
``<ns>:events``                     stream  crawl events (``started``, ``finished``, ``site
                                            paused``, ...: :mod:`.fleet.events`), capped, for other
                                            programs to read with their own consumer group
                                            (docs/events.md); the group ``notify`` is the
                                            webhook deliverer's
``<ns>:events:{<ns>:events}:told:<seed_id>``
                                    string  tagged layouts: ``started`` or ``finished``, what
                                            was told last of the seed (``lua/tell_once.lua``;
                                            in the events stream's slot); expires with the
                                            seed's counters once finished
``<ns>:seeds:held``                 hash    seed -> JSON (who, when, why): held seeds, read by
                                            every worker every 0.25 s
                                            (:mod:`~meteorseed_scrapy.queue.consume.seed_control`)
``<ns>:seeds:cancelled``            zset    seed -> when its cancel's mark lapses (ms): a task
                                            of it read before then is settled as cancelled
``<ns>:seeds:controls``             hash    seed -> JSON: its last control (paused, resumed,
                                            cancelled; who, when)
``<ns>:items``                      stream  the feed of committed items (``_id``, ``site_id``,
                                            ``seed_id``, ``task_id``, ``committed_at``, ``doc``),
                                            capped, when ``METEORSEED_ITEMS_FEED`` is on; on a
                                            cluster one per shard, ``<ns>:{s<k>}:items``
``<ns>:{<site>}:strikes``           string  ``<n>:<ms>``: n consecutive 429/403 strikes (the
                                            backoff exponent) and the Redis time in ms the
                                            last strike paused the site; a 429 to a request
                                            granted before that only confirms the pause
``<ns>:{<site>}:tighten``           string  rate factor (< 1) for a while after a 429/403
                                            (bucket, leases, pause, strikes and tighten are
                                            keyed by the site's ``limits.quota_key`` instead
                                            when its rule config names one: the sites of one
                                            host share them; breaker, probe and health stay
                                            the site's own, on a tagged layout in the quota's
                                            slot: ``<ns>:{<quota>}:site:<site>:breaker``)
``<ns>:{<site>}:adaptive``          hash    the site's fleet-wide adaptive delay
                                            (``lua/adaptive.lua``: ``delay`` and ``latency`` of
                                            the last window, ms; ``at``, ``n``, ``sum``,
                                            ``good``, ``good_sum``: the window's samples;
                                            ``updates``); expires 10 min after the last sample
``<ns>:{<site>}:robots``            hash    robots.txt caps of the site: host -> least ms
                                            between two requests (Crawl-delay, Request-rate);
                                            read by ``lua/gate.lua`` when robots are obeyed
``<ns>:adaptive``                   zset    sites (quota keys) with an adaptive state -> epoch
                                            s last flushed (what ``meteorseed status`` lists)
``<ns>:failed:<task_id>``           string  why the task's last delivery failed (callback or
                                            store error); quoted in its dead letter when it
                                            keeps failing. Expires after ``METEORSEED_DONE_TTL``.
``<ns>:{<site>}:fp:<sha1>``         string  content fingerprint of an article (title + start of
                                            content, :mod:`meteorseed_scrapy.sites.reposts`)
                                            -> id of the first document seen with it; reposts
                                            under other URLs get ``duplicate_of`` it. Expires
                                            after the site's dedup window (default 30 days).
``<ns>:fp:<sha1>``                  string  the same, namespace-wide, with
                                            ``METEORSEED_REPOSTS_ACROSS_SITES`` (reposts
                                            across sites): -> the first document of any site;
                                            expires after the dedup window of the site that
                                            set it. About 190 bytes each (benchmarks/
                                            repost_memory.py); no hash tag: spread over a
                                            cluster's slots.
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
``<ns>:workers``                    zset    the live-worker registry: consumer name -> the
                                            Redis time (ms) its liveness lapses unless renewed
                                            (its keep-alive thread renews it every CLAIM_IDLE/10
                                            for CLAIM_IDLE/2). Listed and lapsed = dead: the
                                            others take its pending tasks at once, then drop it
                                            (:mod:`meteorseed_scrapy.queue.fleet.liveness`); a
                                            consumer never listed waits for CLAIM_IDLE. One key,
                                            untagged: its scripts touch no other
``<ns>:shards``                     string  the namespace's ``METEORSEED_STREAM_SHARDS``, set by
                                            its first worker or writer (``1u``: one untagged
                                            shard); another count is refused
                                            (:mod:`meteorseed_scrapy.queue.shards`)
``<ns>:store``                      string  the store the namespace's items go to (its URI
                                            without credentials, an SQLite file's absolute
                                            path), set by its first worker; a worker with
                                            another is refused
                                            (:mod:`meteorseed_scrapy.store.identity`)
==================================  ======  ===================================================
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

from meteorseed_scrapy.queue.plumbing.connection import is_cluster_url
from meteorseed_scrapy.settings import (
    DEFAULTS,
    MAX_SHARDS,
    WorkerConfig,
    redis_url_from,
    stream_shards,
    text_setting,
)
from meteorseed_scrapy.task.lanes import BANDS, DEFAULT_LANE, LANES, band_of
from meteorseed_scrapy.task.validation import check_spider
from meteorseed_scrapy.validators import ConfigError

if TYPE_CHECKING:
    from meteorseed_scrapy.settings import SettingsSource

GROUP = "workers"
SHARDS_SETTING = "METEORSEED_STREAM_SHARDS"


def shard_of(site_id: str, shards: int) -> int:
    """The shard of a site: stable across processes and versions (CRC-32, not ``hash()``)."""
    return zlib.crc32(site_id.encode("utf-8")) % shards if shards > 1 else 0


@dataclass(frozen=True)
class ShardKeys:
    """The keys of one stream shard: everything one task's life touches in one script.

    Untagged (one shard on one Redis) these are the historical names (``<ns>:tasks``, ...);
    tagged they all carry the shard's hash tag (``<ns>:{s<k>}:tasks``, ...), so every script
    and MULTI over them stays in one Redis Cluster slot. ``spiders`` are the named task sets
    this view includes besides the default one (tasks that name no spider): each has its own
    task streams and delayed set (``<prefix>:spider:<name>:tasks...``, same slot).
    """

    namespace: str
    index: int = 0
    tagged: bool = False
    cluster: bool = False  # dead letters per shard (on one Redis: the one ``<ns>:dead``)
    spiders: tuple[str, ...] = ()

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:{{s{self.index}}}" if self.tagged else self.namespace

    @property
    def stream(self) -> str:
        return f"{self.prefix}:tasks"

    def _set_prefix(self, spider: str | None) -> str:
        """Where a task set's keys start: the shard's prefix, or its spider's under it."""
        if not spider:
            return self.prefix
        check_spider(spider)
        return f"{self.prefix}:spider:{spider}"

    def task_stream(self, lane: str, band: str, spider: str | None = None) -> str:
        """The stream of one lane and band (``<prefix>:tasks`` for scheduled/normal) of the
        default task set, or of ``spider``'s (``<prefix>:spider:<spider>:tasks...``)."""
        if lane not in LANES or band not in BANDS:
            raise ValueError(f"no task stream for lane {lane!r}, band {band!r}")
        base = f"{self._set_prefix(spider)}:tasks"
        if lane == DEFAULT_LANE and band == "normal":
            return base
        # Named after the main stream, so a tagged shard keeps all its lanes in its slot.
        return f"{base}:{lane}:{band}"

    @property
    def task_sets(self) -> tuple[str, ...]:
        """The task sets of this view: "" (the default set), then each spider's."""
        return ("", *self.spiders)

    @cached_property
    def streams(self) -> tuple[str, ...]:
        """Every task stream of the view, lane by lane in :data:`LANES` order, bands in
        :data:`BANDS` order, and within a band each task set (default first): what
        ``read.lua`` reads as one lane's streams in order."""
        return tuple(self.task_stream(lane, band, spider) for lane in LANES for band in BANDS
                     for spider in self.task_sets)

    @property
    def streams_per_lane(self) -> int:
        return len(BANDS) * len(self.task_sets)

    @cached_property
    def stream_lanes(self) -> dict[str, tuple[str, str]]:
        """Task stream -> its (lane, band)."""
        return {self.task_stream(lane, band, spider): (lane, band) for lane in LANES
                for band in BANDS for spider in self.task_sets}

    @cached_property
    def stream_spiders(self) -> dict[str, str]:
        """Task stream -> the spider of its set ("" for the default set)."""
        return {self.task_stream(lane, band, spider): spider for lane in LANES
                for band in BANDS for spider in self.task_sets}

    def set_streams(self, spider: str) -> tuple[str, ...]:
        """The task streams of one set ("": the default), in lane and band order."""
        return tuple(self.task_stream(lane, band, spider) for lane in LANES for band in BANDS)

    def stream_for(self, lane: str, priority: int, spider: str | None = None) -> str:
        """Where a task of ``lane``, ``priority`` and ``spider`` waits."""
        return self.task_stream(lane, band_of(priority), spider)

    def delayed_of(self, spider: str | None) -> str:
        """A task set's delayed set (``<prefix>:delayed`` for the default set)."""
        return f"{self._set_prefix(spider)}:delayed"

    @cached_property
    def delayeds(self) -> tuple[str, ...]:
        """The delayed set of every task set of the view (default first)."""
        return tuple(self.delayed_of(spider) for spider in self.task_sets)

    @property
    def dead(self) -> str:
        """The dead letters: ``<ns>:dead`` on one Redis (a script may touch any key there),
        ``<ns>:{s<k>}:dead`` on a cluster (``dead.lua`` moves a task in one slot)."""
        return f"{self.prefix}:dead" if self.cluster else f"{self.namespace}:dead"

    @property
    def delayed(self) -> str:
        """The default task set's delayed set (see :meth:`delayed_of`)."""
        return self.delayed_of(None)

    @property
    def counts(self) -> str:
        """Tasks ever added to this shard's streams (hash, field ``added``; ``counts_lib.lua``)."""
        return f"{self.prefix}:counts"

    def done(self, task_id: str) -> str:
        return f"{self.prefix}:done:{task_id}"

    @property
    def items_feed(self) -> str:
        """The items feed this shard's acks append to: ``<ns>:items``, on a cluster one per
        shard (``<ns>:{s<k>}:items``: ``ack.lua`` appends in its stream's slot)."""
        return f"{self.prefix}:items" if self.cluster else f"{self.namespace}:items"

    def crawl(self, seed_id: str) -> str:
        """A seed's progress counters in this shard (hash; ``lua/progress_lib.lua``)."""
        return f"{self.prefix}:crawl:{seed_id}"

    def crawl_site(self, site_id: str) -> str:
        """A site's progress totals in this shard (hash; ``lua/progress_lib.lua``)."""
        return f"{self.prefix}:crawlsite:{site_id}"

    def failed(self, task_id: str) -> str:
        return f"{self.prefix}:failed:{task_id}"

    def seen(self, site_id: str) -> str:
        """A site's dedup root (of a site of this shard); every dedup key starts with it."""
        if self.tagged:
            return f"{self.prefix}:seen:{site_id}"
        return f"{self.namespace}:seen:{{{site_id}}}"

    def history(self, site_id: str) -> str:
        """A site's task history root (``lua/history_lib.lua``), in its dedup root's slot."""
        if self.tagged:
            return f"{self.prefix}:hist:{site_id}"
        return f"{self.namespace}:hist:{{{site_id}}}"


#: The first part after ``<ns>:`` of every key of the layout, hash tags (``{…}``) aside: what
#: tells a namespace's own keys from those of a namespace nested in it, as older versions, which
#: allowed ``:`` in a namespace, could make (``prod:eu:tasks`` under ``prod``). A test checks
#: that every key the layout makes is of one of these kinds.
KEY_KINDS = frozenset({
    "adaptive", "counts", "crawl", "crawlsite", "dead", "delayed", "done", "events", "failed",
    "fp", "held", "hist", "items", "overrides", "seed", "seeds", "seen", "shards", "sites",
    "spider", "spiders", "store", "tasks", "workers",
})


def check_namespace(namespace: str) -> str:
    """``namespace`` if it can name a namespace, else :class:`ConfigError` naming
    ``METEORSEED_NAMESPACE``. No ``:``: every key is ``<ns>:…``, so namespace ``a`` would hold
    every key of ``a:b`` (``reset`` of one would delete the other); no spaces, braces (Redis
    Cluster hash tags) or newlines."""
    if not namespace or any(c in namespace for c in " {}\n"):
        raise ConfigError("METEORSEED_NAMESPACE", f"invalid namespace {namespace!r}")
    if ":" in namespace:
        raise ConfigError(
            "METEORSEED_NAMESPACE",
            f"invalid namespace {namespace!r}: it may not contain ':' (every key is "
            f"'<namespace>:...', so namespace {namespace.split(':')[0]!r} would hold every key "
            f"of this one); use '-' or '_' instead, e.g. {namespace.replace(':', '-')!r}")
    return namespace


def own_key(namespace: str, key: str) -> bool:
    """True when ``key`` is one of ``namespace``'s keys, not one of a namespace nested in it."""
    prefix = f"{namespace}:"
    if not key.startswith(prefix):
        return False
    kind = key[len(prefix):].split(":", 1)[0]
    return kind.startswith("{") or kind in KEY_KINDS


@dataclass(frozen=True)
class KeyLayout:
    """Every key of a namespace. ``shards`` (``METEORSEED_STREAM_SHARDS``) splits the task
    streams and what goes with them (:class:`ShardKeys`) by site; ``cluster`` (a cluster URL)
    tags even a single shard and the seed registry and site rules, so that every script and
    MULTI touches one slot. ``KeyLayout(ns)`` is the historical single-Redis layout."""

    namespace: str = DEFAULTS["METEORSEED_NAMESPACE"]
    shards: int = 1
    cluster: bool = False
    #: The named task sets this layout includes besides the default one: a worker's own
    #: spider, or every spider of the namespace (:attr:`spiders_key`) for status and lookups.
    spiders: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_namespace(self.namespace)
        for spider in self.spiders:
            check_spider(spider)
        if type(self.shards) is not int or not 1 <= self.shards <= MAX_SHARDS:
            raise ConfigError(SHARDS_SETTING, f"expected an integer from 1 to {MAX_SHARDS}, "
                              f"got {self.shards!r}")

    @classmethod
    def from_settings(cls, settings: SettingsSource) -> KeyLayout:
        """The layout ``settings`` give: namespace, stream shards, and whether the Redis URL
        names a cluster (which tags every multi-key group); ConfigError naming the setting."""
        return cls(text_setting(settings, "METEORSEED_NAMESPACE"), stream_shards(settings),
                   is_cluster_url(redis_url_from(settings)))

    @classmethod
    def for_config(cls, config: WorkerConfig) -> KeyLayout:
        """The layout of a worker's config."""
        return cls(config.namespace, config.shards, is_cluster_url(config.redis_url))

    def with_spiders(self, spiders: Iterable[str]) -> KeyLayout:
        """This layout with the task sets of ``spiders`` (sorted, without repeats)."""
        return replace(self, spiders=tuple(sorted(set(spiders))))

    @property
    def group(self) -> str:
        return GROUP

    @property
    def tagged(self) -> bool:
        """Shard keys carry a hash tag (``<ns>:{s<k>}:...``)."""
        return self.cluster or self.shards > 1

    @cached_property
    def shard_keys(self) -> tuple[ShardKeys, ...]:
        """Every shard, in index order."""
        return tuple(ShardKeys(self.namespace, k, self.tagged, self.cluster, self.spiders)
                     for k in range(self.shards))

    def for_site(self, site_id: str) -> ShardKeys:
        return self.shard_keys[shard_of(site_id, self.shards)]

    @cached_property
    def _by_stream(self) -> dict[str, ShardKeys]:
        return {stream: shard for shard in self.shard_keys for stream in shard.streams}

    def shard_of_stream(self, stream: str) -> ShardKeys:
        """The shard a task stream belongs to (KeyError for a key that is not a task stream)."""
        return self._by_stream[stream]

    @property
    def only(self) -> ShardKeys:
        """The one shard of a single-shard layout; a sharded layout has no such thing, and code
        that asks for it names a key it cannot know (it needs the task's site)."""
        if self.shards != 1:
            raise ValueError(f"{SHARDS_SETTING}={self.shards}: this key depends on the site's "
                             "shard (use KeyLayout.for_site or shard_keys)")
        return self.shard_keys[0]

    # Single-shard shortcuts (the historical API): the keys of the only shard.
    @property
    def stream(self) -> str:
        return self.only.stream

    def task_stream(self, lane: str, band: str) -> str:
        return self.only.task_stream(lane, band)

    def stream_for(self, lane: str, priority: int, spider: str | None = None) -> str:
        return self.only.stream_for(lane, priority, spider)

    @property
    def dead(self) -> str:
        """``<ns>:dead`` on one Redis, whatever the shard count (see :attr:`deads`)."""
        if len(self.deads) != 1:
            return self.only.dead  # (raises: a cluster has one per shard)
        return self.deads[0]

    @property
    def delayed(self) -> str:
        return self.only.delayed

    def done(self, task_id: str) -> str:
        return self.only.done(task_id)

    def failed(self, task_id: str) -> str:
        return self.only.failed(task_id)

    @cached_property
    def streams(self) -> tuple[str, ...]:
        """Every task stream of every shard (shard by shard, each in lane and band order)."""
        return tuple(s for shard in self.shard_keys for s in shard.streams)

    @cached_property
    def stream_lanes(self) -> dict[str, tuple[str, str]]:
        """Task stream (of any shard) -> its (lane, band)."""
        return {s: lb for shard in self.shard_keys for s, lb in shard.stream_lanes.items()}

    @cached_property
    def stream_spiders(self) -> dict[str, str]:
        """Task stream (of any shard) -> the spider of its task set ("": the default set)."""
        return {s: sp for shard in self.shard_keys for s, sp in shard.stream_spiders.items()}

    @cached_property
    def deads(self) -> tuple[str, ...]:
        """Every dead-letter stream: ``(<ns>:dead,)`` on one Redis, one per shard on a
        cluster (``<ns>:{s<k>}:dead``)."""
        return tuple(dict.fromkeys(shard.dead for shard in self.shard_keys))

    @property
    def shard_count(self) -> str:
        """Where the shard count is recorded (string), so a mismatch is refused."""
        return f"{self.namespace}:shards"

    @property
    def store(self) -> str:
        """Where the namespace's store is recorded (string), so another one is refused."""
        return f"{self.namespace}:store"

    def seen(self, site_id: str) -> str:
        """The site's dedup root, in its shard's slot; every dedup key of the site starts
        with it."""
        return self.for_site(site_id).seen(site_id)

    def history(self, site_id: str) -> str:
        """The site's task history root; every history key of the site starts with it."""
        return self.for_site(site_id).history(site_id)

    @property
    def spiders_key(self) -> str:
        """The spiders that have task sets in the namespace (set), added to by every writer
        before it writes a named task: what status, lookups and ``reset`` go through."""
        return f"{self.namespace}:spiders"

    @property
    def spider_workers(self) -> str:
        """Each worker's spider (hash: consumer -> spider name), written at its start: with
        the live-worker registry, who takes which task set (status, the shared warning)."""
        return f"{self.namespace}:spiders:workers"

    @property
    def workers(self) -> str:
        """The live-worker registry (zset: consumer -> liveness deadline, Redis time ms)."""
        return f"{self.namespace}:workers"

    @property
    def held(self) -> str:
        """Sites an operator holds (hash: site -> JSON ``by``, ``at``, ``reason``)."""
        return f"{self.namespace}:held"

    @property
    def seeds_held(self) -> str:
        """Seeds an operator holds (hash: seed -> JSON ``by``, ``at``, ``reason``)."""
        return f"{self.namespace}:seeds:held"

    @property
    def seeds_cancelled(self) -> str:
        """Cancelled seeds (zset: seed -> when its cancel's mark lapses, ms)."""
        return f"{self.namespace}:seeds:cancelled"

    @property
    def seed_controls(self) -> str:
        """Each controlled seed's last control (hash: seed -> JSON ``state``, ``by``, ``at``)."""
        return f"{self.namespace}:seeds:controls"

    @property
    def overrides(self) -> str:
        """Sites whose limits an operator overrides (hash: site -> JSON ``rate``,
        ``concurrency``, ``by``, ``at``)."""
        return f"{self.namespace}:overrides"

    @property
    def events(self) -> str:
        """The namespace's crawl events (stream: ``event``, ``site``, ``by``, ...)."""
        return f"{self.namespace}:events"

    @property
    def items_feed(self) -> str:
        """The feed of committed items (stream: ``_id``, ``site_id``, ..., docs/items-feed.md);
        on a cluster, one per shard: :attr:`items_feeds`."""
        return f"{self.namespace}:items"

    @property
    def items_feeds(self) -> tuple[str, ...]:
        """Every items feed stream: ``<ns>:items``, or on a cluster each shard's."""
        return tuple(dict.fromkeys(shard.items_feed for shard in self.shard_keys))

    @property
    def adaptive_sites(self) -> str:
        """The index of sites with a fleet-wide adaptive state (zset: quota -> epoch s)."""
        return f"{self.namespace}:adaptive"

    def site(self, site: str, what: str) -> str:
        """A per-site politeness key (``bucket``, ``leases``, ``pause``, ...), hash-tagged."""
        return f"{self.namespace}:{{{site}}}:{what}"

    def site_own(self, site: str, quota: str, what: str) -> str:
        """A site's own breaker key (``breaker``, ``probe``, ``health``). On a tagged layout a
        site that shares another quota keeps them in that quota's slot, because ``gate.lua``
        reads them with the quota's keys: ``<ns>:{<quota>}:site:<site>:<what>``."""
        if self.tagged and quota != site:
            return f"{self.namespace}:{{{quota}}}:site:{site}:{what}"
        return self.site(site, what)

    def content_fingerprint(self, site_id: str, fp: str) -> str:
        return f"{self.namespace}:{{{site_id}}}:fp:{fp}"

    def content_fingerprint_any(self, fp: str) -> str:
        """A content fingerprint shared by every site (reposts across sites)."""
        return f"{self.namespace}:fp:{fp}"

    @property
    def pattern(self) -> str:
        """Glob matching every key of the namespace (for ``reset`` and tests)."""
        return f"{self.namespace}:*"

    # -- seed registry (meteorseed_scrapy.seeding.registry) --------------------------------------
    # On a cluster every registry key carries the ``{seeds}`` tag (its scripts touch several),
    # and the site rules the ``{sites}`` tag (pushed in a MULTI with their revision).

    @property
    def _registry(self) -> str:
        return f"{self.namespace}:{{seeds}}" if self.cluster else f"{self.namespace}:seeds"

    @property
    def seeds(self) -> str:
        """Index of every registered seed_id (zset, score 0, lexical order)."""
        return self._registry

    @property
    def seeds_by_site(self) -> str:
        return f"{self._registry}:by_site"

    def seed(self, seed_id: str) -> str:
        """One seed's definition and run state (hash)."""
        if self.cluster:
            return f"{self._registry}:seed:{seed_id}"
        return f"{self.namespace}:seed:{seed_id}"

    @property
    def seeds_due(self) -> str:
        return f"{self._registry}:due"

    @property
    def seeds_yield(self) -> str:
        return f"{self._registry}:yield"

    # -- site rules pushed to Redis (meteorseed_scrapy.sites.remote) ----------------------------

    @property
    def sites(self) -> str:
        return f"{self.namespace}:{{sites}}" if self.cluster else f"{self.namespace}:sites"

    @property
    def sites_rev(self) -> str:
        return f"{self.sites}:rev"

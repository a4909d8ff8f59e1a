"""The worker's side of the task streams: read, reclaim, keep alive, ack, dead-letter, hand back.

Every method is one round trip (a command, a pipeline or one Lua script) on a ``redis.asyncio``
client created with ``decode_responses=True``; but the entries that :meth:`StreamConsumer.read`
and the reclaims deliver come back as bytes (``NEVER_DECODE``), so that the
strict decoding of :class:`Delivery` sees them as stored: the client's own decoding would raise
on a byte that is not UTF-8 and fail the whole read, or with another ``encoding_errors`` replace
it silently. Every delivery names the stream (lane and band) it came from, and everything done
to it later goes to that stream. Acks and dead letters are written by :mod:`.acks`. Nothing
here knows about Scrapy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.client import NEVER_DECODE

from meteorseed_scrapy.queue.consume.acks import Completion, Settler
from meteorseed_scrapy.queue.consume.delivery import Delivery, Ref, trim_shares
from meteorseed_scrapy.queue.consume.group import ConsumerGroup
from meteorseed_scrapy.queue.consume.lanes import DEFAULT_WEIGHTS, LaneShares, LaneWeights
from meteorseed_scrapy.queue.fleet.crawl_progress import Settle
from meteorseed_scrapy.queue.fleet.spiders import SharedDefaultSet, foreign_workers
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.plumbing.scripts import call_as_bytes
from meteorseed_scrapy.queue.shards import call_scripts, is_cluster
from meteorseed_scrapy.settings import DEFAULTS, FeedConfig
from meteorseed_scrapy.task.lanes import LANES

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

__all__ = ["StreamConsumer"]

#: Options of a command whose reply reaches the decoder as bytes, whatever the client decodes.
_AS_BYTES: dict[str, Any] = {NEVER_DECODE: []}


class StreamConsumer:
    """Reads every task stream of ``keys`` (shards x lanes x bands) as one consumer of the group.

    Scripts get one shard's keys at a time (one Redis Cluster slot); a read goes through the
    shards starting at a rotating one until it has what it asked for.
    """

    def __init__(self, redis: AsyncRedis, keys: KeyLayout, consumer: str,
                 weights: LaneWeights | None = None, spider: str | None = None,
                 progress_retention: int = DEFAULTS["METEORSEED_SEED_PROGRESS_RETENTION"]
                 ) -> None:
        self.redis = redis
        #: Seconds a finished seed's counters are kept (queue/fleet/crawl_progress.py).
        self.progress_retention = progress_retention
        self.keys = keys
        self.consumer = consumer
        # The worker's spider: ``keys`` holds its task set (when its name can name one) besides
        # the default set; listed in the namespace at ensure_group.
        self.spider = spider
        self._shared = SharedDefaultSet(redis, keys, consumer, spider)
        self.streams = keys.streams
        self.shards = keys.shard_keys
        # stream -> (its shard's number, 1-based index among the shard's streams)
        self._index = {stream: (k, i) for k, shard in enumerate(self.shards)
                       for i, stream in enumerate(shard.streams, start=1)}
        self.shares = LaneShares(weights or LaneWeights.parse(DEFAULT_WEIGHTS))
        self._cluster = is_cluster(redis)
        self._turn = 0  # the shard a read starts at, rotating
        self._read = scripts.register(redis, "read")
        self._handback = scripts.register(redis, "handback")
        self._reclaim = scripts.register(redis, "reclaim")
        self._takeover = scripts.register(redis, "takeover")
        self._settler = Settler(redis, keys, consumer, progress_retention)
        self._reclaim_cursors = [["0-0"] * len(shard.streams) for shard in self.shards]
        self._names = {stream.encode(): stream for stream in self.streams}

    def _rotation(self) -> list[int]:
        n = len(self.shards)
        start, self._turn = self._turn, (self._turn + 1) % n
        return [(start + i) % n for i in range(n)]

    def _name(self, stream: bytes | str) -> str:
        if isinstance(stream, str):
            return stream
        return self._names.get(stream) or stream.decode("utf-8", "surrogateescape")

    def _by_shard(self, refs: Sequence[Ref]) -> dict[int, list[tuple[int, str]]]:
        out: dict[int, list[tuple[int, str]]] = {}
        for stream, msg_id in refs:
            k, index = self._index[stream]
            out.setdefault(k, []).append((index, msg_id))
        return out

    def lane_of(self, delivery: Delivery) -> str:
        """The lane whose stream ``delivery`` came from (not the task's own: a retry of a
        realtime task waits in the retry lane)."""
        return self.keys.stream_lanes[delivery.stream][0]

    def membership(self) -> ConsumerGroup:
        """This consumer's membership of the group (leave, prune, quiet and durability checks:
        :class:`~meteorseed_scrapy.queue.consume.group.ConsumerGroup`), under the same name."""
        return ConsumerGroup(self.redis, self.keys, self.consumer, self.spider)

    async def ensure_group(self) -> None:
        """:meth:`ConsumerGroup.ensure` (every task stream's group, the shard count)."""
        await self.membership().ensure()

    async def read(self, count: int, block_ms: int) -> list[Delivery]:
        """Up to ``count`` new entries, shared between the lanes by weight, bands in priority
        order (one script call per shard, until filled). When every stream is empty, a wait of
        up to ``block_ms`` for a new entry in any of them (XREAD BLOCK, which takes nothing),
        then one more read: so an idle worker wakes as soon as a task arrives in any lane, and
        takes the highest band of what arrived, not whichever stream was written first."""
        reply, last = await self._read_shards(count)
        if not reply and block_ms > 0 and await self._wait(last, block_ms):
            reply, _ = await self._read_shards(count)
        if any(not self.keys.stream_spiders[stream] for stream, _ in reply):
            await self._shared.took_unnamed(time.monotonic())
        # Decoding never raises: a malformed entry is delivered with its error, to be
        # dead-lettered alone, and the rest of the batch goes on.
        return [Delivery.decode(stream, _text(msg_id), _pairs(flat), 1)
                for stream, entries in reply for msg_id, flat in entries]

    async def _read_shards(self, count: int
                           ) -> tuple[list[tuple[str, list[Any]]], dict[str, str]]:
        """The entries read (stream, entries) and, when none, each stream's last entry id."""
        shares = self.shares.split(count)
        lanes = len(shares)
        reply: list[tuple[str, list[Any]]] = []
        last: dict[str, str] = {}
        for k in self._rotation():
            streams = self.shards[k].streams
            got, ids = await call_as_bytes(
                self.redis, self._read, streams,
                [self.keys.group, self.consumer, self.shards[k].streams_per_lane,
                 *self.shares.weights, *shares],
            )
            last.update(zip(streams, (_text(i) for i in ids or []), strict=False))
            taken = [0] * lanes
            for stream, entries in got or []:
                name = self._name(stream)
                reply.append((name, entries))
                taken[LANES.index(self.keys.stream_lanes[name][0])] += len(entries)
            shares = [max(0, s - t) for s, t in zip(shares, taken, strict=True)]
            # What a lane took beyond its share (an empty lane's slots) comes off the others.
            left = count - sum(len(e) for _, e in reply)
            shares = trim_shares(shares, left)
            if left <= 0:
                break
        return reply, last

    async def _wait(self, last: dict[str, str], block_ms: int) -> bool:
        """Wait up to ``block_ms`` for an entry after ``last`` (stream -> id) in any stream;
        True when one came. A cluster serves a multi-stream XREAD only within one slot: it
        waits on one shard at a time, for a share of block_ms, so every shard is swept again
        soon."""
        shown: Sequence[str] = self.streams
        if self._cluster and len(self.shards) > 1:
            shown = self.shards[self._rotation()[0]].streams
            block_ms = max(1, block_ms // len(self.shards))
        streams = [s for s in shown if s in last]
        if not streams:
            return False
        reply = await self.redis.execute_command(
            "XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", *streams,
            *[last[s] for s in streams], **_AS_BYTES,
        )
        return bool(reply)

    async def reclaim(self, min_idle_s: float, count: int) -> list[Delivery]:
        """Entries idle for ``min_idle_s`` on any consumer (dead workers, failed tasks)."""
        out: list[Delivery] = []
        for k in self._rotation():
            if len(out) >= count:
                break
            shard = self.shards[k]
            cursors, entries = await call_as_bytes(
                self.redis, self._reclaim, shard.streams,
                [self.keys.group, self.consumer, int(min_idle_s * 1000), count - len(out),
                 *self._reclaim_cursors[k]])
            self._reclaim_cursors[k] = [_text(c) for c in cursors]
            out += _claimed(shard.streams, entries)
        return out

    async def reclaim_from(self, dead: Sequence[bytes | str], count: int
                           ) -> tuple[list[Delivery], set[bytes]]:
        """Up to ``count`` entries pending on ``dead`` consumers
        (:mod:`~meteorseed_scrapy.queue.fleet.liveness`), whatever their idle time, counted as
        :meth:`reclaim` counts them; and the dead that still hold entries. One script per shard:
        racing survivors get disjoint entries."""
        out: list[Delivery] = []
        holding: set[bytes] = set()
        for k in self._rotation():  # (every shard, even once full: who still holds what)
            shard = self.shards[k]
            entries, held = await call_as_bytes(
                self.redis, self._takeover, shard.streams,
                [self.keys.group, self.consumer, max(0, count - len(out)), *dead])
            out += _claimed(shard.streams, entries)
            holding.update(held)
        # A dead worker of another spider may hold tasks of its set, which this one does not
        # see: counted as holding, so only its own spider's workers drop it from the registry.
        holding.update(await foreign_workers(self.redis, self.keys, dead, self.spider))
        return out, holding

    def touch_calls(self, refs: Sequence[Ref]) -> list[tuple[Sequence[str], list[Any]]]:
        """The ``(keys, args)`` of the touch script (``touch.lua``: reset the idle time of our
        pending entries) per shard, for ``refs``: run from the keep-alive thread
        (:mod:`~meteorseed_scrapy.worker.keepalive`), on a blocking client of its own, so it
        reads only the key layout."""
        calls: list[tuple[Sequence[str], list[Any]]] = []
        for k, pairs in self._by_shard(refs).items():
            args: list[Any] = [self.keys.group, self.consumer]
            for index, msg_id in pairs:
                args += [index, msg_id]
            calls.append((self.shards[k].streams, args))
        return calls

    @staticmethod
    def touch_lost(calls: Sequence[tuple[Sequence[str], Any]], replies: Sequence[Any]
                   ) -> list[Ref]:
        """The refs the touch script's ``replies`` (one per call) report as no longer ours."""
        return [(str(streams[int(index) - 1]), _text(msg_id))
                for (streams, _), lost in zip(calls, replies, strict=True)
                for index, msg_id in lost]

    async def hand_back(self, deliveries: Sequence[Delivery], idle_s: float) -> int:
        counts = {d.ref: max(0, d.deliveries - 1) for d in deliveries}
        calls = []
        for k, pairs in self._by_shard([d.ref for d in deliveries]).items():
            args: list[Any] = [self.keys.group, self.consumer, int(idle_s * 1000)]
            for index, msg_id in pairs:
                args += [index, msg_id, counts[(self.shards[k].streams[index - 1], msg_id)]]
            calls.append((self.shards[k].streams, args))
        if not calls:
            return 0
        return sum(int(n) for n in await call_scripts(self.redis, self._handback, calls))

    async def complete(self, refs: Sequence[Ref], ttl: int,
                       settles: Sequence[Settle | None] = (),
                       done: Sequence[Completion | None] = (),
                       feed: FeedConfig | None = None) -> int:
        """XACK and XDEL those of ``refs`` still pending on this consumer (``ack.lua``, one
        call per stream, all in one round trip); returns how many were acked. A task
        redelivered after its record was written (its ack refused: another worker had reclaimed
        it) is acked without a refetch. An entry another worker reclaimed meanwhile (this one
        was cut off for longer than CLAIM_IDLE) is left to its new owner.

        ``settles`` (one per ref, in order; missing: counted under no seed) say what each
        acked entry counts for in its seed's progress
        (:mod:`~meteorseed_scrapy.queue.fleet.crawl_progress`). ``done`` (one per ref, or None)
        holds a task's completion record and its items feed entries, capped
        as ``feed`` says: written by the same script as the ref's ack, feed first, so a
        refused XADD leaves the task unacked and without a record (on a cluster, the record of
        a task in another shard's stream than its site's is in another slot: written after the
        scripts).
        """
        return await self._settler.complete(refs, ttl, settles, done, feed)

    async def dead_letter(self, delivery: Delivery, reason: str, fingerprint: str = "") -> str:
        """Move ``delivery`` to its shard's dead letters and release its URL (one script when
        its site's dedup root is in that shard, as it is unless the task was put in another
        shard's stream by hand or by an older layout); returns the dead letter's id, as
        ``meteorseed dead show`` takes it.

        The dead letter keeps the message whole (:attr:`Delivery.dead_payload`). Refused,
        returning "" and writing nothing, when the entry is no longer pending on this consumer
        (another worker reclaimed it meanwhile: it is that worker's now)."""
        return await self._settler.dead_letter(delivery, reason, fingerprint)


def _text(value: bytes | str) -> str:
    """An id or a cursor of a reply left as bytes (ASCII: Redis makes them)."""
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def _claimed(streams: Sequence[str], entries: Sequence[Any]) -> list[Delivery]:
    """Deliveries of a claiming script's ``{stream index, id, fields, deliveries}`` rows."""
    return [Delivery.decode(streams[int(index) - 1], _text(msg_id), _pairs(flat),
                            int(deliveries)) for index, msg_id, flat, deliveries in entries]


def _pairs(flat: Sequence[Any] | None) -> list[tuple[Any, Any]]:
    """A flat ``[field, value, ...]`` list as stored, as pairs (repeats kept)."""
    flat = flat or []
    return list(zip(flat[::2], flat[1::2], strict=True))

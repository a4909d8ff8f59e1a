"""Writing exec tasks into the task streams: fleet-wide dedup, enqueue, backlog, backpressure.

Dedup and enqueue happen in one Lua script (``lua/enqueue.lua`` with the two-layer dedup of
``lua/dedup_lib.lua``), so concurrent writers (several ``seed-expand`` runs, workers yielding
child requests) never enqueue one URL twice. Each task goes to the stream of its lane and band
(``KeyLayout.stream_for``). A stream is never trimmed: an entry leaves it only when a worker has
acked it (and then XDELs it), which is also what makes :meth:`TaskWriter.backlog` cheap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from meteorseed_scrapy.queue import scripts
from meteorseed_scrapy.queue.dedup import (
    RECRAWL_META_KEY,
    Fingerprinter,
    fingerprint_bytes,
    recrawl_window,
    url_fingerprint,
)
from meteorseed_scrapy.queue.dedup_server import check_server_config
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.shards import call_scripts, check_shard_count, is_cluster
from meteorseed_scrapy.task.exec_task import MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.task.lanes import LANES
from meteorseed_scrapy.task.validation import TaskError

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["CHUNK_SIZE", "SCRIPT_ORDER", "AddResult", "Encoded", "NotSent", "ScriptOrder",
           "StreamCount", "TaskWriter", "pack_tasks"]

logger = logging.getLogger(__name__)

#: Tasks per script call. A call blocks Redis while it runs; 500 dedup checks + XADDs take a
#: few milliseconds, so workers reading the stream never wait long behind a big seed file.
CHUNK_SIZE = 500
#: Seconds between two ``on_wait`` reports while :meth:`TaskWriter.wait_for_room` waits.
WAIT_REPORT_INTERVAL = 10.0

class ScriptOrder:
    """One :meth:`TaskWriter.add_encoded` call in a caller's sequence of them (``seed-expand``'s
    batches), made under :data:`SCRIPT_ORDER` with the call before it as ``after``.

    Its scripts are written to Redis right behind those of the call before, on the same
    connection, without waiting for their replies: Redis runs them back to back and in order
    (it does not idle for a round trip and the packing of the next batch between two
    batches), and the replies are read in order. A call is not sent when the one before it
    could not be sent. (On a cluster, or a single-connection client, a call waits for the one
    before it to be done instead.)
    """

    def __init__(self, after: ScriptOrder | None = None) -> None:
        loop = asyncio.get_running_loop()
        self.after = after
        self.sent: asyncio.Future[None] = loop.create_future()  # its scripts written
        self.done: asyncio.Future[None] = loop.create_future()  # their replies read
        self.lane: _Lane = after.lane if after is not None else _Lane()

    def finish(self, sent: bool) -> None:
        """Mark this call done (``sent``: whether its scripts were written)."""
        for future, ok in ((self.sent, sent), (self.done, True)):
            if not future.done():
                if ok:
                    future.set_result(None)
                else:
                    future.set_exception(NotSent("not sent"))
                    future.exception()  # (retrieved: the caller sees its own error)
        self.after = None  # (done: so a long run does not keep a chain of every call)

    async def wait_sent(self) -> None:
        """Until the call before has written its scripts; :class:`NotSent` if it did not."""
        if self.after is not None:
            await asyncio.wait([self.after.sent])
            if self.after.sent.exception() is not None:
                raise NotSent("the add_encoded call before this one was not sent")

    async def wait_done(self) -> None:
        if self.after is not None:
            await asyncio.wait([self.after.done])


@dataclass
class _Lane:
    """The connection of a sequence of :class:`ScriptOrder` calls while any is unanswered."""

    conn: Any = None
    users: int = 0
    broken: bool = False  # a connection failed: one call at a time from then on


#: Set around the start of an :meth:`TaskWriter.add_encoded` task by a caller that keeps two
#: of them going (see :class:`ScriptOrder`). A context variable: it reaches the writer through
#: any subclass's ``add_encoded``.
SCRIPT_ORDER: ContextVar[ScriptOrder | None] = ContextVar("SCRIPT_ORDER", default=None)


class NotSent(Exception):
    """An :meth:`TaskWriter.add_encoded` call under :data:`SCRIPT_ORDER` whose call before was
    not sent (it failed first): nothing of it was sent either."""


# enqueue.lua writes the "v" field itself (the task JSON is its only payload); a new message
# version in tasks.py must come with a script update, so fail loudly at import, not in Redis.
_SCRIPT_MESSAGE_VERSION = "1"
if MESSAGE_VERSION != _SCRIPT_MESSAGE_VERSION:  # pragma: no cover - guards a future edit
    raise RuntimeError(
        f"lua/enqueue.lua writes message version {_SCRIPT_MESSAGE_VERSION}, "
        f"tasks.py encodes version {MESSAGE_VERSION}: update the script"
    )


class Encoded(NamedTuple):
    """One task as ``enqueue.lua`` takes it (see :meth:`TaskWriter.encode`)."""

    root: str | None  # the site's dedup root, None = no dedup
    fingerprint: bytes
    window: str  # re-crawl window argument ("" = the site's stored one)
    payload: str  # the task JSON
    stream: str  # the task stream of its lane and band


@dataclass(frozen=True)
class AddResult:
    """What one :meth:`TaskWriter.add` call did; ``fresh[i]`` says whether its i-th task was
    enqueued (False: a duplicate), in the order the tasks were given."""

    enqueued: int = 0
    duplicates: int = 0
    fresh: tuple[bool, ...] = field(default=(), compare=False)

    def __add__(self, other: AddResult) -> AddResult:
        return AddResult(self.enqueued + other.enqueued, self.duplicates + other.duplicates,
                         self.fresh + other.fresh)


_NO_ROOT = bytes(8)  # root index 0 (no dedup) and an unused entry
_FIRST_ROOT = (1).to_bytes(2, "big")
_ROOT, _FINGERPRINT, _WINDOW, _PAYLOAD, _STREAM = (itemgetter(i) for i in range(5))
_ENTRY = itemgetter(slice(0, 6))  # a fingerprint's dedup entry (see enqueue.lua)


def _one_root_meta(chunk: Sequence[Encoded]) -> bytes:
    """enqueue.lua's 8-byte records of tasks that all have root 1: the 16-byte fingerprints
    joined once and their first 6 bytes laid out by strided slices (C loops, where a slice
    and a join per task took twice as long on the path between two script calls)."""
    count = len(chunk)
    fps = b"".join(map(_FINGERPRINT, chunk))
    if len(fps) != 16 * count:  # (fingerprints are always 16 bytes: a guard)
        return _FIRST_ROOT + _FIRST_ROOT.join(map(_ENTRY, map(_FINGERPRINT, chunk)))
    records = bytearray(8 * count)
    records[1::8] = _FIRST_ROOT[1:] * count
    for k in range(6):
        records[2 + k::8] = fps[k::16]
    return bytes(records)


def _without_repeats(chunk: Sequence[Encoded]) -> tuple[Sequence[Encoded], list[int] | None]:
    """``chunk`` less each task whose fingerprint an earlier task of it has, and the positions
    of the tasks kept (None: all). In one call with one root and one window (one generation),
    enqueue.lua flags such a repeat a duplicate whatever the state of Redis: it need not be
    sent, parsed and looked up there (seed lists repeat URLs; Redis is the busier side)."""
    fingerprints = [*map(_FINGERPRINT, chunk)]
    if len(set(fingerprints)) == len(fingerprints):
        return chunk, None
    roots = set(map(_ROOT, chunk))
    if len(roots) != 1 or None in roots or len(set(map(_WINDOW, chunk))) != 1:
        return chunk, None
    seen: set[bytes] = set()
    kept: list[int] = []
    for position, fingerprint in enumerate(fingerprints):
        if fingerprint not in seen:
            seen.add(fingerprint)
            kept.append(position)
    return [chunk[i] for i in kept], kept


def pack_tasks(records: Iterable[tuple[int, bytes, str, str]]) -> list[str | bytes]:
    """``enqueue.lua``'s arguments after ``now`` from ``(root index, fingerprint, window, task
    JSON)`` per task (root index 0: no dedup; window "": the site's); see the script.

    The JSONs travel newline-terminated in one string and the roots and dedup entries as fixed
    8-byte records: two C-level joins per batch, no per-task length prefixes.
    """
    payloads: list[str] = []
    meta: list[bytes] = []
    windows: list[str] = []
    index_bytes: dict[int, bytes] = {}
    for number, (root, fp, window, payload) in enumerate(records, 1):
        payloads.append(payload)
        if root:
            head = index_bytes.get(root)
            if head is None:
                head = index_bytes[root] = root.to_bytes(2, "big")
            meta.append(head + fp[:6])
            if window:
                windows += (str(number), window)
        else:
            meta.append(_NO_ROOT)
    payloads.append("")
    jsons = "\n".join(payloads)
    if jsons.count("\n") != len(meta):  # (JSON escapes newlines: a guard, not a path)
        raise ValueError("a task JSON holds a raw newline")
    return [jsons, b"".join(meta), *windows]


@dataclass(frozen=True)
class StreamCount:
    """Tasks of one stream (or a sum of streams): waiting to be delivered, and pending."""

    waiting: int = 0
    pending: int = 0

    def __add__(self, other: StreamCount) -> StreamCount:
        return StreamCount(self.waiting + other.waiting, self.pending + other.pending)

    @classmethod
    def of(cls, length: Any, pending: Any) -> StreamCount:
        """From the replies of XLEN and XPENDING (summary form) of one stream."""
        if isinstance(length, Exception):
            raise length
        if isinstance(pending, ResponseError) and str(pending).startswith("NOGROUP"):
            # No consumer group yet (no worker ever started): every entry is waiting.
            pending_count = 0
        elif isinstance(pending, Exception):
            raise pending
        elif isinstance(pending, (list, tuple)):  # raw reply: a cluster MULTI skips parsing
            pending_count = int(pending[0])
        else:
            pending_count = int(pending["pending"])
        return cls(max(0, int(length) - pending_count), pending_count)


async def shard_stream_counts(redis: Any, streams: Sequence[str], group: str
                              ) -> dict[str, StreamCount]:
    """XLEN and XPENDING of ``streams`` (of one shard: one slot) in one MULTI."""
    async with redis.pipeline(transaction=True) as pipe:
        for stream in streams:
            pipe.xlen(stream)
            pipe.xpending(stream, group)
        replies = await pipe.execute(raise_on_error=False)
    return {stream: StreamCount.of(length, pending)
            for stream, length, pending in zip(streams, replies[::2], replies[1::2], strict=True)}


class TaskWriter:
    """Adds exec tasks to their lanes' streams (deduplicated per site) and watches the backlog.

    ``clock`` (epoch seconds) replaces the Redis server's TIME for the re-crawl windows; only
    tests pass one. Every writer of a namespace must share one clock, which the server's is.
    ``lane`` puts every task this writer adds in that lane (``seed-expand --lane``); None
    keeps each task's own. ``fingerprinter``: the project's Scrapy request fingerprinter for the
    dedup keys (:func:`~meteorseed_scrapy.queue.dedup.project_fingerprinter`); None keeps the
    canonical-URL ones. Every writer of a namespace must use the same.
    """

    def __init__(self, redis: Redis, keys: KeyLayout,
                 clock: Callable[[], int] | None = None, lane: str | None = None,
                 fingerprinter: Fingerprinter | None = None) -> None:
        # No I/O here (not even reading the script file): writers are built in constructors.
        self.fingerprinter = fingerprinter
        self._redis = redis
        self._keys = keys
        self._clock = clock
        self._scripts = scripts.Scripts(redis)
        self._config_checked = False
        self._last_window: tuple[int | None, str] = (None, "")
        # (site, lane, priority) -> (task stream, dedup root): the same few for every URL
        self._routes: dict[tuple[str, str, int], tuple[str, str]] = {}
        if lane is not None and lane not in LANES:
            raise ValueError(f"lane must be one of {', '.join(LANES)}, got {lane!r}")
        self._lane = lane

    @property
    def keys(self) -> KeyLayout:
        return self._keys

    def _now(self) -> str:
        return "" if self._clock is None else str(int(self._clock()))

    def encode(self, task: ExecTask, dedup: bool = True, canonical: str | None = None) -> Encoded:
        """Everything :meth:`add` sends for ``task``; raises :class:`TaskError` (too large, not
        encodable, a URL that cannot be canonicalised, a bad ``meta.recrawl_after``)."""
        if self._lane is not None and task.lane != self._lane:
            task = replace(task, lane=self._lane)
        route = self._routes.get((task.site_id, task.lane, task.priority))
        if route is None:
            route = self._route(task)
        root, stream = route
        try:
            payload = task.to_message()["t"]
        except TaskError:
            raise
        except ValueError as exc:  # e.g. a lone surrogate that UTF-8 cannot encode
            raise TaskError("task", f"cannot be encoded as UTF-8 JSON ({exc})") from None
        if not dedup:
            return Encoded(None, b"", "", payload, stream)
        value = task.meta.get(RECRAWL_META_KEY)
        if type(value) is int and value == self._last_window[0]:  # (bool is not int here)
            window = self._last_window[1]  # the same window as the task before: checked then
        else:
            window = recrawl_window(task)
            if type(value) is int:
                self._last_window = (value, window)
        try:
            if (canonical is not None and self.fingerprinter is None and task.method == "GET"
                    and not task.body):
                fp = url_fingerprint(canonical)  # (the common case, without the checks)
            else:
                fp = fingerprint_bytes(task, canonical, self.fingerprinter)
        except ValueError as exc:
            problem = "cannot be fingerprinted" if self.fingerprinter else "cannot be canonicalised"
            raise TaskError("url", f"{problem}: {exc}") from None
        return Encoded(root, fp, window, payload, stream)

    def seed_encoder(self, task: ExecTask, dedup: bool = True
                     ) -> Callable[[ExecTask, str, str], Encoded]:
        """:meth:`encode` for the tasks of one seed, which share ``task``'s site, lane,
        priority, meta, method and body: ``(task, canonical URL, message JSON) -> Encoded``,
        with the JSON of ``task.to_message()`` (the expansion checked it). What is the same
        for every task is worked out once, here. Raises :class:`TaskError` as :meth:`encode`.
        """
        if self.seed_encoder_reads_tasks(task, dedup):
            return lambda each, canonical, _: self.encode(each, dedup, canonical)
        root, stream = self._routes.get((task.site_id, task.lane, task.priority)) or (
            self._route(task))
        window = recrawl_window(task)
        new = tuple.__new__

        def encode_one(each: ExecTask, canonical: str, payload: str) -> Encoded:
            return new(Encoded, (root, url_fingerprint(canonical), window, payload, stream))

        return encode_one

    def seed_encoder_reads_tasks(self, task: ExecTask, dedup: bool = True) -> bool:
        """Whether :meth:`seed_encoder`'s callable for ``task``'s seed reads each task it is
        given (True) or only the canonical URL and JSON (False): then the seed's template task
        may stand for each, as ``seed-expand`` passes it, sparing an object per URL. (An
        override of :meth:`seed_encoder` may read only seed-level fields of ``each``.)"""
        return (not dedup or self.fingerprinter is not None or task.method != "GET"
                or bool(task.body) or (self._lane is not None and task.lane != self._lane))

    def _route(self, task: ExecTask) -> tuple[str, str]:
        if len(self._routes) >= 4096:  # (a worker may see many sites: bounded)
            self._routes.clear()
        shard = self._keys.for_site(task.site_id)
        route = (shard.seen(task.site_id), shard.stream_for(task.lane, task.priority))
        self._routes[(task.site_id, task.lane, task.priority)] = route
        return route

    def _script_args(self, stream: str, chunk: Sequence[Encoded]
                     ) -> tuple[list[str], list[str | bytes]]:
        roots = set(map(_ROOT, chunk))
        if len(roots) == 1 and None not in roots and len(set(map(_WINDOW, chunk))) == 1:
            # One site and one window (a seed's URLs): packed by C-level joins alone, the
            # window sent with the first task only.
            window = chunk[0].window
            payloads = [*map(_PAYLOAD, chunk)]
            # (JSON escapes newlines: a guard; `in` is a memchr, five times a count's speed)
            if "\n" in "".join(payloads):
                raise ValueError("a task JSON holds a raw newline")
            payloads.append("")
            jsons = "\n".join(payloads)
            return ([stream, *roots],
                    [self._now(), jsons, _one_root_meta(chunk),
                     *(("1", window) if window else ())])
        positions: dict[str, int] = {}  # dedup root -> 1-based position after the stream key
        # A window equal to the one already sent for that root in this call goes as "": the
        # script then reuses the window it holds for the root (the same value) instead of
        # reading it from Redis again for every task.
        sent: dict[int, str] = {}
        records: list[tuple[int, bytes, str, str]] = []
        for root, fp, window, payload, _ in chunk:
            if root is None:
                records.append((0, b"", "", payload))
                continue
            index = positions.setdefault(root, len(positions) + 1)
            if window:
                if sent.get(index) == window:
                    window = ""
                else:
                    sent[index] = window
            records.append((index, fp, window, payload))
        return [stream, *positions], [self._now(), *pack_tasks(records)]

    async def add(self, tasks: Sequence[ExecTask], *, dedup: bool = True) -> AddResult:
        """Enqueue ``tasks``, skipping those the site has already seen within its window.

        Every task is encoded before anything is sent, so a task that is too large (or otherwise
        not encodable) raises :class:`TaskError` and nothing of the call is enqueued.
        """
        return await self.add_encoded([self.encode(task, dedup) for task in tasks])

    async def add_encoded(self, encoded: Sequence[Encoded]) -> AddResult:
        """Enqueue tasks already encoded by :meth:`encode`, in script calls of
        :data:`CHUNK_SIZE` per stream, all sent in one round trip (concurrently on a cluster);
        under :data:`SCRIPT_ORDER`, behind the call before (see :class:`ScriptOrder`)."""
        sequence = SCRIPT_ORDER.get()
        try:
            return await self._add_encoded(encoded, sequence)
        finally:
            if sequence is not None:
                sequence.finish(sent=False)  # (a failure before sending; else done already)

    async def _add_encoded(self, encoded: Sequence[Encoded], sequence: ScriptOrder | None
                           ) -> AddResult:
        if not encoded:
            if sequence is not None:
                sequence.finish(sent=True)  # (nothing to send: the next call goes on)
            return AddResult()
        if not self._config_checked:
            self._config_checked = True
            await check_shard_count(self._redis, self._keys)
            for warning in await check_server_config(self._redis):
                logger.warning("%s", warning)
        script = self._scripts["enqueue"]
        groups: list[Sequence[Encoded]]  # the tasks of each stream, in order
        order: list[int] | None = None  # their positions in ``encoded`` (None: the same)
        if len(set(map(_STREAM, encoded))) == 1:  # one lane and band: a seed's URLs
            groups = [encoded]
        else:
            streams: dict[str, list[int]] = {}
            for position, item in enumerate(encoded):
                streams.setdefault(item.stream, []).append(position)
            groups = [[encoded[p] for p in positions] for positions in streams.values()]
            order = [p for positions in streams.values() for p in positions]
        chunks = [group[i : i + CHUNK_SIZE] for group in groups
                  for i in range(0, len(group), CHUNK_SIZE)]
        sending = [_without_repeats(chunk) for chunk in chunks]
        calls = [self._script_args(sent[0].stream, sent) for sent, _ in sending]
        # A stream's dedup roots are in its shard's slot, so each call touches one slot.
        if sequence is None:
            replies = await call_scripts(self._redis, script, calls)
        elif is_cluster(self._redis) or self._redis.single_connection_client:
            await sequence.wait_sent()
            await sequence.wait_done()
            try:
                replies = await call_scripts(self._redis, script, calls)
            finally:
                sequence.finish(sent=True)
        else:
            replies = await self._call_in_order(sequence, script, calls)
        enqueued = duplicates = 0
        texts: list[str] = []
        for chunk, (sent, kept), (added, dups, flags) in zip(chunks, sending, replies,
                                                              strict=True):
            enqueued += int(added)
            duplicates += int(dups)
            text = flags.decode() if isinstance(flags, bytes) else str(flags)
            if len(text) != len(sent):
                raise ValueError(f"enqueue.lua answered {len(text)} flags for {len(sent)} tasks")
            if kept is not None:  # the repeats left out: duplicates, as the script would say
                every = ["0"] * len(chunk)
                for position, mark in zip(kept, text, strict=True):
                    every[position] = mark
                duplicates += len(chunk) - len(sent)
                text = "".join(every)
            texts.append(text)
        flagged = map("1".__eq__, "".join(texts))
        if order is None:
            fresh = tuple(flagged)
        else:
            by_position = [False] * len(encoded)
            for position, flag in zip(order, flagged, strict=True):
                by_position[position] = flag
            fresh = tuple(by_position)
        result = AddResult(enqueued, duplicates, fresh)
        logger.debug(
            "enqueued %d tasks, %d duplicates, into %s", result.enqueued, result.duplicates,
            ", ".join(dict.fromkeys(chunk[0].stream for chunk in chunks)),
        )
        return result

    async def _call_in_order(self, order: ScriptOrder, script: Any,
                             calls: list[tuple[list[str], list[str | bytes]]]) -> list[Any]:
        """``calls`` of ``script`` written right behind those of ``order.after`` on its
        connection, the replies read after its (see :class:`ScriptOrder`)."""
        lane, pool, sent = order.lane, self._redis.connection_pool, False
        try:
            await order.wait_sent()
            if lane.broken:  # (one at a time from here on, as without an order)
                await order.wait_done()
                sent = True
                return list(await call_scripts(self._redis, script, calls))
            if lane.conn is None:
                lane.conn = await pool.get_connection()
            conn = lane.conn
            lane.users += 1
            try:
                for keys, args in calls:
                    # EVAL, not EVALSHA: a script cache flushed mid-run cannot answer NOSCRIPT
                    # to one call while the call queued behind it, run after a reload, gets
                    # in first. (Redis hashes the 16 KB source: ~1 % of a call.) No health
                    # check: its PING reply would be read in place of a script's.
                    await conn.send_packed_command(
                        conn.pack_command("EVAL", script.script, len(keys), *keys, *args),
                        check_health=False)
                sent = True
                order.sent.set_result(None)
                await order.wait_done()
                replies: list[Any] = []
                for _ in calls:
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:  # (read: the connection stays in step)
                        replies.append(exc)
            except (RedisConnectionError, RedisTimeoutError):
                # As redis-py retries a call whose connection failed (enqueue.lua's dedup
                # makes a second run of a batch harmless), but one call at a time, in order.
                lane.broken = True
                await self._drop(lane, conn)
                if not sent:
                    sent = True
                    order.sent.set_result(None)
                await order.wait_done()
                return list(await call_scripts(self._redis, script, calls))
            except BaseException:
                await self._drop(lane, conn)  # (replies left unread: no one else may use it)
                raise
            finally:
                lane.users -= 1
                if lane.users == 0 and lane.conn is not None:
                    held, lane.conn = lane.conn, None
                    await pool.release(held)
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
            return replies
        finally:
            order.finish(sent)

    @staticmethod
    async def _drop(lane: _Lane, conn: Any) -> None:
        if lane.conn is conn:
            lane.conn = None
        await conn.disconnect()

    def fingerprint(self, task: ExecTask) -> bytes:
        """``task``'s dedup key as this writer computes it."""
        return fingerprint_bytes(task, fingerprinter=self.fingerprinter)

    async def release(self, task: ExecTask) -> bool:
        """Forget ``task``'s URL, so a later seed may enqueue it again; True if it was there.

        ``dead.lua`` does the same for a dead-lettered task, in the same step as the dead letter.
        """
        removed = await self._scripts["dedup_release"](
            keys=[self._keys.seen(task.site_id)], args=[self._now(), self.fingerprint(task)]
        )
        return int(removed) > 0

    async def is_seen(self, task: ExecTask) -> bool:
        """True when ``task``'s site has recorded its URL and the re-crawl window is not over."""
        [seen] = await self._scripts["dedup_seen"](
            keys=[self._keys.seen(task.site_id)], args=[self._now(), self.fingerprint(task)]
        )
        return bool(int(seen))

    async def backlog(self) -> int:
        """Tasks in the streams that no worker has received yet (every lane and band)."""
        return sum((await self.stream_counts()).values(), StreamCount()).waiting

    async def stream_counts(self) -> dict[str, StreamCount]:
        """Waiting and pending tasks per task stream, read in one MULTI per shard so the
        counts of a stream agree.

        Workers XDEL an entry right after XACKing it, so XLEN counts waiting plus pending
        entries, and XPENDING's summary gives the pending ones. This works on Redis 6.2, whose
        XINFO GROUPS has no ``lag``.
        """
        out: dict[str, StreamCount] = {}
        for shard in self._keys.shard_keys:
            out.update(await shard_stream_counts(self._redis, shard.streams, self._keys.group))
        return out

    async def wait_for_room(
        self, max_backlog: int, on_wait: Callable[[int], None], poll: float = 1.0
    ) -> int:
        """Return the backlog once it is at most ``max_backlog``; until then sleep ``poll``
        seconds between checks and call ``on_wait(backlog)`` every
        :data:`WAIT_REPORT_INTERVAL` seconds.

        Backpressure only: nothing is ever trimmed to make room.
        """
        if max_backlog < 0:
            raise ValueError(f"max_backlog must be >= 0, got {max_backlog}")
        last_report: float | None = None
        while True:
            backlog = await self.backlog()
            if backlog <= max_backlog:
                return backlog
            now = time.monotonic()
            if last_report is None or now - last_report >= WAIT_REPORT_INTERVAL:
                last_report = now
                logger.info("backlog %d > %d: waiting for workers", backlog, max_backlog)
                on_wait(backlog)
            await asyncio.sleep(poll)

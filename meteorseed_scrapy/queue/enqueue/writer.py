"""Writing exec tasks into the task streams: fleet-wide dedup and enqueue; the backlog and the
backpressure writers wait on are counted by :mod:`~meteorseed_scrapy.queue.enqueue.backlog`.

Dedup and enqueue happen in one Lua script (``lua/enqueue.lua`` with the two-layer dedup of
``lua/dedup_lib.lua``), so concurrent writers (several ``seed-expand`` runs, workers yielding
child requests) never enqueue one URL twice. Each task goes to the stream of its lane and band
(``KeyLayout.stream_for``). A stream is never trimmed: an entry leaves it only when a worker has
acked it (and then XDELs it), which is also what makes :meth:`TaskWriter.backlog` cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from meteorseed_scrapy.queue.enqueue.backlog import StreamCount, stream_counts, wait_for_room
from meteorseed_scrapy.queue.enqueue.batch_pipeline import ScriptOrder, call_in_order
from meteorseed_scrapy.queue.enqueue.dedup import (
    RECRAWL_META_KEY,
    Fingerprinter,
    check_server_config,
    fingerprint_bytes,
    recrawl_window,
    url_fingerprint,
)
from meteorseed_scrapy.queue.enqueue.enqueue_calls import (
    AddResult,
    Encoded,
    EnqueueCalls,
    script_args,
)
from meteorseed_scrapy.queue.fleet.crawl_progress import (
    enqueued_seeds,
    events_key,
    finish_if_done,
    owner_line,
    tell_started,
)
from meteorseed_scrapy.queue.fleet.spiders import register_spiders
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.queue.shards import call_scripts, check_shard_count
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.lanes import LANES
from meteorseed_scrapy.task.validation import TaskError

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

__all__ = ["FingerprintError", "TaskEncoder", "TaskWriter"]

logger = logging.getLogger(__name__)


class FingerprintError(TaskError):
    """The project's ``REQUEST_FINGERPRINTER_CLASS`` failed for a task (or returned no bytes):
    where Scrapy's scheduler would have raised."""


class TaskEncoder(NamedTuple):
    """:meth:`TaskWriter.encoder`'s answer. ``reads_tasks``: whether ``encode`` reads each task
    it is given (True) or only the canonical URL and JSON (False: then a seed's template task
    may stand for each, as ``seed-expand`` passes it, sparing an object per URL)."""

    encode: Callable[[ExecTask, str, str], Encoded]
    reads_tasks: bool


class _Shared(NamedTuple):
    """What the tasks of one encoder share (``root`` None: no dedup)."""

    reads_tasks: bool
    lane: str | None  # the writer's lane, replacing the tasks' own, or None
    root: str | None
    window: str
    stream: str
    owner: str


class TaskWriter:
    """Adds exec tasks to their lanes' streams (deduplicated per site) and watches the backlog.

    ``clock`` (epoch seconds) replaces the Redis server's TIME for the re-crawl windows; only
    tests pass one. Every writer of a namespace must share one clock, which the server's is.
    ``lane`` puts every task this writer adds in that lane (``seed-expand --lane``); None
    keeps each task's own. ``fingerprinter``: the project's Scrapy request fingerprinter for the
    dedup keys (:func:`~meteorseed_scrapy.queue.enqueue.dedup.project_fingerprinter`); None
    keeps the canonical-URL ones. Every writer of a namespace must use the same.
    """

    def __init__(self, redis: AsyncRedis, keys: KeyLayout,
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
        # (site, lane, priority, spider) -> (dedup root, task stream): the same few for every URL
        self._routes: dict[tuple[str, str, int, str | None], tuple[str, str]] = {}
        self._spiders_new: set[str] = set()  # task sets to list in the registry before writing
        self._spiders_listed: set[str] = set()
        if lane is not None and lane not in LANES:
            raise ValueError(f"lane must be one of {', '.join(LANES)}, got {lane!r}")
        self._lane = lane
        #: Seconds a seed this writer finishes (its expansion's end) keeps its counters.
        self.progress_retention: int = DEFAULTS["METEORSEED_SEED_PROGRESS_RETENTION"]

    @property
    def keys(self) -> KeyLayout:
        return self._keys

    @property
    def redis(self) -> AsyncRedis:
        return self._redis

    def _now(self) -> str:
        return "" if self._clock is None else str(int(self._clock()))

    def encoder(self, task: ExecTask, dedup: bool = True) -> TaskEncoder:
        """The one task encoder: ``encode(each, canonical, payload)`` for ``task`` and every
        task sharing its site, lane, priority, spider, meta, method and body (one seed's
        tasks), what they share worked out once, here; ``canonical`` and ``payload`` are
        ``each``'s canonical URL and ``to_message()`` JSON, as the expansion checked them.
        Raises :class:`TaskError` (a bad ``meta.recrawl_after``), and ``encode`` too (too
        large, not encodable, a URL that cannot be canonicalised)."""
        shared = self._shared(task, dedup)
        if shared.reads_tasks:
            return TaskEncoder(partial(self._encode, shared), True)
        root, window, stream, owner = shared.root, shared.window, shared.stream, shared.owner
        new = tuple.__new__

        def encode_seed_url(each: ExecTask, canonical: str, payload: str) -> Encoded:
            # (_encode inlined for the common case: a GET without body, deduplicated by the
            # canonical URL; ``each`` is not read)
            return new(Encoded, (root, url_fingerprint(canonical), window, payload, stream,
                                 owner))

        return TaskEncoder(encode_seed_url, False)

    def encode(self, task: ExecTask, dedup: bool = True, canonical: str | None = None
               ) -> Encoded:
        """Everything :meth:`add` sends for ``task``: its :meth:`encoder` applied to it."""
        return self._encode(self._shared(task, dedup), task, canonical)

    def _shared(self, task: ExecTask, dedup: bool) -> _Shared:
        lane = self._lane if self._lane is not None and task.lane != self._lane else None
        if lane is not None:
            task = replace(task, lane=lane)
        root, stream = (self._routes.get((task.site_id, task.lane, task.priority, task.spider))
                        or self._route(task))
        owner = owner_line(task.seed_id, task.site_id)
        if not dedup:
            return _Shared(True, lane, None, "", stream, owner)
        value = task.meta.get(RECRAWL_META_KEY)
        if type(value) is int and value == self._last_window[0]:  # (bool is not int here)
            window = self._last_window[1]  # the same window as the task before: checked then
        else:
            window = recrawl_window(task)
            if type(value) is int:
                self._last_window = (value, window)
        reads = (self.fingerprinter is not None or task.method != "GET" or bool(task.body)
                 or lane is not None)
        return _Shared(reads, lane, root, window, stream, owner)

    def _encode(self, shared: _Shared, each: ExecTask, canonical: str | None = None,
                payload: str | None = None) -> Encoded:
        if shared.lane is not None:
            each, payload = replace(each, lane=shared.lane), None
        if payload is None:
            try:
                payload = each.to_message()["t"]
            except TaskError:
                raise
            except ValueError as exc:  # e.g. a lone surrogate that UTF-8 cannot encode
                raise TaskError("task", f"cannot be encoded as UTF-8 JSON ({exc})") from None
        if shared.root is None:
            if canonical is None:
                # Not deduplicated, so not canonicalised yet: a URL that every reader would
                # refuse (ExecTask.from_message) is refused here, by name, not dead later.
                try:
                    each.canonical_url  # noqa: B018 (a cached property: computed once)
                except ValueError as exc:
                    raise TaskError("url", f"cannot be canonicalised: {exc}") from None
            return Encoded(None, b"", "", payload, shared.stream, shared.owner)
        try:
            fp = fingerprint_bytes(each, canonical, self.fingerprinter)
        except ValueError as exc:
            if self.fingerprinter is not None:
                raise FingerprintError("url", f"cannot be fingerprinted: {exc}") from None
            raise TaskError("url", f"cannot be canonicalised: {exc}") from None
        return Encoded(shared.root, fp, shared.window, payload, shared.stream, shared.owner)

    def _route(self, task: ExecTask) -> tuple[str, str]:
        if len(self._routes) >= 4096:  # (a worker may see many sites: bounded)
            self._routes.clear()
        shard = self._keys.for_site(task.site_id)
        route = (shard.seen(task.site_id), shard.stream_for(task.lane, task.priority, task.spider))
        self._routes[(task.site_id, task.lane, task.priority, task.spider)] = route
        if task.spider is not None and task.spider not in self._spiders_listed:
            self._spiders_new.add(task.spider)
        return route

    async def add(self, tasks: Sequence[ExecTask], *, dedup: bool = True) -> AddResult:
        """Enqueue ``tasks``, skipping those the site has already seen within its window.

        Every task is encoded before anything is sent, so a task that is too large (or otherwise
        not encodable) raises :class:`TaskError` and nothing of the call is enqueued.
        """
        return await self.enqueue([self.encode(task, dedup) for task in tasks])

    async def enqueue(self, encoded: Sequence[Encoded], order: ScriptOrder | None = None,
                      holds: Mapping[str, bool] | None = None) -> AddResult:
        """Enqueue tasks already encoded (by :meth:`encoder`), in script calls of
        :data:`~meteorseed_scrapy.queue.enqueue.enqueue_calls.CHUNK_SIZE` per stream, all sent
        in one round trip (concurrently on a cluster). With ``order``, written behind the call
        before it in a caller's sequence (see
        :class:`~meteorseed_scrapy.queue.enqueue.batch_pipeline.ScriptOrder`), which is
        finished when this returns or raises. ``holds``: seed_id -> whether the expansion has
        more of that seed's URLs after these (a held seed is not finished:
        :mod:`~meteorseed_scrapy.queue.fleet.crawl_progress`)."""
        try:
            return await self._enqueue(encoded, order, holds)
        finally:
            if order is not None:
                order.finish(sent=False)  # (a failure before sending; else done already)

    async def _enqueue(self, encoded: Sequence[Encoded], sequence: ScriptOrder | None,
                       holds: Mapping[str, bool] | None = None) -> AddResult:
        if not encoded:
            if sequence is not None:
                sequence.finish(sent=True)  # (nothing to send: the next call goes on)
            return AddResult()
        if not self._config_checked:
            self._config_checked = True
            await check_shard_count(self._redis, self._keys)
            for warning in await check_server_config(self._redis):
                logger.warning("%s", warning)
        if self._spiders_new:  # listed before written: status and lookups find every set
            await register_spiders(self._redis, self._keys, self._spiders_new)
            self._spiders_listed |= self._spiders_new
            self._spiders_new = set()
        script = self._scripts["enqueue"]
        batch = EnqueueCalls(encoded)
        calls = [self._script_args(sent[0].stream, sent, holds)
                 for sent, holds in zip(batch.sent, batch.holds(holds), strict=True)]
        if sequence is None:
            replies = await call_scripts(self._redis, script, calls)
        else:
            replies = await call_in_order(self._redis, sequence, script, calls)
        result = batch.result(replies)
        if self._keys.tagged:  # (one Redis: enqueue.lua told it)
            await tell_started(self._redis, self._keys, enqueued_seeds(
                (e.owner for e in encoded), result.fresh, holds), self.progress_retention)
        logger.debug(
            "enqueued %d tasks, %d duplicates, into %s", result.enqueued, result.duplicates,
            ", ".join(batch.streams()),
        )
        return result

    def _script_args(self, stream: str, chunk: Sequence[Encoded],
                     holds: Mapping[str, bool] | None = None
                     ) -> tuple[list[str], list[str | bytes]]:
        """One enqueue.lua call's keys and arguments, at this writer's clock."""
        return script_args(stream, chunk, self._now(), events_key(self._keys), holds,
                           self.progress_retention)

    async def release_expansion(self, seed_id: str, site_id: str) -> None:
        """The expansion of ``seed_id`` (of ``site_id``) is over, and its last batch held it
        (its tasks end in an earlier batch): let it go, finishing it when everything it
        enqueued settled already. One script call with no task, in the seed's shard."""
        stream = self._keys.for_site(site_id).stream
        await self._scripts["enqueue"](keys=[stream],
                                       args=self._script_args(stream, [], {seed_id: False})[1])
        if self._keys.tagged:
            await finish_if_done(self._redis, self._keys, [seed_id], self.progress_retention)

    def fingerprint(self, task: ExecTask) -> bytes:
        """``task``'s dedup key as this writer computes it."""
        return fingerprint_bytes(task, fingerprinter=self.fingerprinter)

    async def release(self, task: ExecTask) -> bool:
        """Forget ``task``'s URL, so a later seed may enqueue it again; True if it was there.
        (``dead.lua`` does the same for a dead-lettered task, in the step of its dead letter.)"""
        removed = await self._scripts["dedup_release"](
            keys=[self._keys.seen(task.site_id)], args=[self._now(), self.fingerprint(task)])
        return int(removed) > 0

    async def backlog(self) -> int:
        """Tasks in the streams that no worker has received yet (every lane and band)."""
        counts = await stream_counts(self._redis, self._keys)
        return sum(counts.values(), StreamCount()).waiting

    async def wait_for_room(self, max_backlog: int, on_wait: Callable[[int], None] | None = None,
                            poll: float = 1.0) -> int:
        """Return :meth:`backlog` once it is at most ``max_backlog``, waiting for workers until
        then (:func:`~meteorseed_scrapy.queue.enqueue.backlog.wait_for_room`). Backpressure only:
        nothing is ever trimmed to make room."""
        return await wait_for_room(self.backlog, max_backlog, on_wait, poll)

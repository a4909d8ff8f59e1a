"""Which spiders have task sets in a namespace, and which spider each worker runs.

A task that names its ``spider`` waits in that spider's task set (:class:`ShardKeys`); the
spiders that have one are listed in ``<ns>:spiders``, written by every writer before the first
task of a set, so that whoever must see every task (status, lookups, requeue, the backlog
limit) builds a layout with all of them (:func:`with_registered`). A worker lists its spider in
``<ns>:spiders:workers`` at its start; with the live-worker registry that tells status which
sets have live workers, and a worker which other spiders share the default set with it.
Nothing here knows about Scrapy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.fleet.snapshot import SpiderStatus
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.reads import Batch, Plan, call
from meteorseed_scrapy.queue.plumbing.replies import bytes_of, text_of
from meteorseed_scrapy.task.validation import TaskError, check_spider

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis, SyncRedis

__all__ = [
    "alive_consumers",
    "foreign_workers",
    "listed_spiders",
    "live_spiders",
    "register_spiders",
    "register_worker",
    "registered_plan",
    "spider_plan",
    "spider_rows",
    "spiders_of",
    "with_registered",
    "with_registered_sync",
    "worker_spider",
]

logger = logging.getLogger(__name__)


def spiders_of(members: Iterable[Any]) -> list[str]:
    """Valid spider names of a registry reply (anything else in the set is ignored: a name
    that cannot be a key's part names no task set)."""
    out = []
    for member in members or ():
        name = text_of(member, "backslashreplace")
        try:
            check_spider(name)
        except TaskError:
            continue
        out.append(name)
    return sorted(set(out))


def worker_spider(name: Any) -> str | None:
    """The task set a spider named ``name`` reads besides the default one, or None (a name
    that cannot name a set: its worker reads the default set only, and says so once)."""
    try:
        return check_spider(name)
    except TaskError as exc:
        logger.warning("Spider name %r cannot name a task set (%s): this worker takes only "
                       "tasks that name no spider", name, exc.problem)
        return None


async def register_spiders(redis: AsyncRedis, keys: KeyLayout, names: Iterable[str]) -> None:
    """List ``names`` as spiders with a task set (before their tasks are written)."""
    names = sorted(set(names))
    if names:
        await redis.sadd(keys.spiders_key, *names)


async def with_registered(redis: AsyncRedis, keys: KeyLayout) -> KeyLayout:
    """``keys`` with every listed spider's task set (an async client)."""
    return keys.with_spiders([*keys.spiders, *spiders_of(await redis.smembers(keys.spiders_key))])


def registered_plan(keys: KeyLayout) -> Plan[KeyLayout]:
    """:func:`with_registered` as a step of a read plan (one round trip)."""
    (replies,) = yield [Batch([call("smembers", keys.spiders_key)])]
    (names,) = replies
    if isinstance(names, Exception):
        raise names
    return keys.with_spiders([*keys.spiders, *spiders_of(names)])


def with_registered_sync(client: SyncRedis, keys: KeyLayout) -> KeyLayout:
    """:func:`with_registered` on a blocking client."""
    return keys.with_spiders([*keys.spiders, *spiders_of(client.smembers(keys.spiders_key))])


async def register_worker(redis: AsyncRedis, keys: KeyLayout, consumer: str, spider: str) -> None:
    """Record that ``consumer`` runs ``spider`` (its start; cleared when it leaves)."""
    await redis.hset(keys.spider_workers, consumer, spider)


def listed_spiders(workers: Mapping[Any, Any]) -> dict[str, str]:
    """consumer -> spider of a ``<ns>:spiders:workers`` reply, as text."""
    return {text_of(c, "backslashreplace"): text_of(s, "backslashreplace")
            for c, s in (workers or {}).items()}


def live_spiders(workers: Mapping[Any, Any], live: Iterable[Any]) -> dict[str, int]:
    """spider -> live workers, from ``<ns>:spiders:workers`` and the live consumers."""
    alive = {text_of(c, "backslashreplace") for c in live}
    out: dict[str, int] = {}
    for consumer, spider in listed_spiders(workers).items():
        if consumer in alive:
            out[spider] = out.get(spider, 0) + 1
    return out


def spider_plan(keys: KeyLayout) -> Plan[tuple[KeyLayout, Any, Any]]:
    """``keys`` with every spider's task set (``<ns>:spiders``), each worker's spider and the
    live-worker registry (consumer -> liveness deadline, ms)."""
    (listed,) = yield [Batch([call("smembers", keys.spiders_key),
                              call("hgetall", keys.spider_workers),
                              call("zrange", keys.workers, 0, -1, withscores=True)])]
    names, workers, live = (None if isinstance(r, Exception) else r for r in listed)
    return keys.with_spiders([*keys.spiders, *spiders_of(names or ())]), workers, live


def alive_consumers(live: Any, now: float) -> list[Any]:
    """Consumers of the live-worker registry's reply (consumer, deadline ms) whose liveness has
    not lapsed at ``now`` (Redis time, s)."""
    return [c for c, deadline in live or [] if float(deadline) > now * 1000]


def spider_rows(by_set: dict[str, list[int]], spider_workers: Any, live: Any, now: float
                ) -> tuple[SpiderStatus, ...]:
    """One row per task set: the default one (every live worker reads it), then each
    spider's (its own live workers). Workers are counted from the live-worker registry."""
    alive = alive_consumers(live, now)
    per_spider = live_spiders(spider_workers or {}, alive)
    return tuple(
        SpiderStatus(spider or None, backlog, pending, delayed,
                     len(alive) if not spider else per_spider.get(spider, 0))
        for spider, (backlog, pending, delayed) in by_set.items())


#: Seconds between two looks for other spiders on the default set, until one is found.
SHARED_CHECK_INTERVAL = 30.0


class SharedDefaultSet:
    """Warns once when a worker takes a task that names no spider while workers of another
    spider are alive on the namespace: those tasks go to whichever worker reads first, and a
    spider may parse pages meant for another (seeds should name their ``spider``)."""

    def __init__(self, redis: AsyncRedis, keys: KeyLayout, consumer: str,
                 spider: str | None) -> None:
        self.redis = redis
        self.keys = keys
        self.consumer = consumer
        self.spider = spider
        self.warned = False
        self._next = 0.0  # monotonic time of the next look

    async def took_unnamed(self, now: float) -> None:
        """A read delivered tasks of the default set (``now``: monotonic seconds)."""
        if self.warned or self.spider is None or now < self._next:
            return
        self._next = now + SHARED_CHECK_INTERVAL
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.spider_workers)
            pipe.zrangebyscore(self.keys.workers, "(" + str(_redis_ms(await self.redis.time())),
                               "+inf")
            workers, live = await pipe.execute(raise_on_error=False)
        if isinstance(workers, Exception) or isinstance(live, Exception):
            return
        others = sorted(s for s in live_spiders(workers, live) if s != self.spider)
        if others:
            self.warned = True
            logger.warning(
                "Spider %r takes tasks that name no spider, and so do live workers of spider(s) "
                "%s on namespace %r: each may get the other's pages. Name the spider in the "
                "seeds (\"spider\": \"%s\"), so that each takes only its own (docs/spiders.md).",
                self.spider, ", ".join(map(repr, others)), self.keys.namespace, self.spider)


def _redis_ms(reply: Any) -> int:
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


async def foreign_workers(redis: AsyncRedis, keys: KeyLayout, dead: Sequence[bytes | str],
                          spider: str | None) -> list[bytes]:
    """Those of ``dead`` consumers that ran another spider than ``spider``: they may hold
    tasks of its set, which a worker of ``spider`` neither sees nor takes."""
    if not dead:
        return []
    spiders = await redis.hmget(keys.spider_workers, list(dead))
    return [bytes_of(name) for name, theirs in zip(dead, spiders, strict=True)
            if theirs is not None and text_of(theirs) != (spider or "")]

"""Moving a scrapy-redis project's waiting work into the task stream.

Read: the scheduler queue (``SCHEDULER_QUEUE_KEY``, a list for FifoQueue/LifoQueue, a sorted
set with score ``-priority`` for PriorityQueue) and the start URLs (``REDIS_START_URLS_KEY``:
list, set or sorted set). Not read: the dupefilter. It holds SHA-1 fingerprints of
method+URL+body, which cannot be turned back into requests.

Each batch goes through :meth:`TaskWriter.add` (deduplicated per site); with ``move`` the batch's
migrated members are then removed one by one (LREM/ZREM/SREM), never the key: a scrapy-redis
process may still be pushing to it, and anything rejected stays where it was.

An entry that cannot become a task (not a request, a forbidden class, too large or too deep,
truncated, ...) is one :class:`RefusedEntry` (key, position, reason), counted in the summary and
left in place; the migration goes on with the next entry. Windows are read by a script that
sends an entry above :data:`~.unpickle.MAX_PAYLOAD_BYTES` as its length only, and every entry
is decoded within the bounds of :mod:`.unpickle`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.migrate.convert import (
    Converted,
    Origin,
    request_dict_to_task,
    start_url_to_task,
)
from meteorseed_scrapy.migrate.unpickle import MAX_PAYLOAD_BYTES, RejectedPayload, loads_request
from meteorseed_scrapy.queue.plumbing.replies import text_of
from meteorseed_scrapy.queue.plumbing.scripts import Scripts
from meteorseed_scrapy.task.validation import TaskError

if TYPE_CHECKING:

    from meteorseed_scrapy.queue.enqueue.enqueue_calls import Encoded
    from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis

logger = logging.getLogger(__name__)

REQUESTS, START_URLS = "requests", "start URLs"
#: Longest rejection reason printed.
MAX_REASON = 300


@dataclass(frozen=True)
class ScrapyRedisSource:
    """The keys of one scrapy-redis spider, named as scrapy-redis names them."""

    spider: str
    queue_key: str
    start_urls_key: str
    #: LifoQueue pops from the head of its list, FifoQueue from the tail: read in that order.
    lifo: bool = False
    encoding: str = "utf-8"

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], spider: str) -> ScrapyRedisSource:
        queue_cls = str(settings.get("SCHEDULER_QUEUE_CLASS") or "")
        return cls(
            spider=spider,
            queue_key=str(settings.get("SCHEDULER_QUEUE_KEY") or "%(spider)s:requests")
            % {"spider": spider},
            start_urls_key=str(settings.get("REDIS_START_URLS_KEY") or "%(name)s:start_urls")
            % {"name": spider},
            lifo=queue_cls.rsplit(".", 1)[-1] in ("LifoQueue", "SpiderStack"),
            encoding=str(settings.get("REDIS_ENCODING") or "utf-8"),
        )


@dataclass(frozen=True)
class RefusedEntry:
    key: str
    #: 0-based, in the order scrapy-redis would serve the entries; None: the whole key.
    position: int | None
    reason: str

    def __str__(self) -> str:
        where = self.key if self.position is None else f"{self.key} entry {self.position}"
        return f"{where}: {self.reason}"


@dataclass
class MigrationSummary:
    requests: int = 0
    start_urls: int = 0
    enqueued: int = 0
    duplicates: int = 0
    rejected: int = 0
    removed: int = 0
    #: entries migrated without some meta keys whose values are not JSON
    meta_dropped: int = 0
    dry_run: bool = False
    move: bool = False

    def __str__(self) -> str:
        read = (f"read {self.requests + self.start_urls} entries "
                f"({self.requests} requests, {self.start_urls} start URLs)")
        if self.dry_run:
            ok = self.requests + self.start_urls - self.rejected
            return f"dry run: {read}, would enqueue up to {ok}, rejected {self.rejected}"
        text = f"{read}, enqueued {self.enqueued}, duplicates {self.duplicates}, " \
               f"rejected {self.rejected}"
        if self.move:
            text += f", removed {self.removed} from scrapy-redis"
        if self.meta_dropped:
            text += f"; {self.meta_dropped} lost non-JSON meta keys"
        return text


# One entry as read: (member as stored, or its length in bytes when too large to read; score or
# None; position for error messages). Members are bytes with a bytes client; redis-py types
# replies as unions, hence Any.
_Entry = tuple[Any, "float | None", int]


def _members(raw: Any) -> list[Any]:
    """Script reply members: bytes, or ``[length]`` (oversized) as the length alone."""
    return [int(m[0]) if isinstance(m, list) else m for m in raw]


async def _entries(client: AsyncRedis, key: str, kind: str, batch: int, move: bool,
                   from_head: bool, kept: list[int]) -> AsyncIterator[list[_Entry]]:
    """Batches of ``key``'s members in the order scrapy-redis would have served them.

    With ``move``, migrated members disappear between batches, so windows start after the
    ``kept[0]`` members left in place (rejected ones) instead of advancing by position.
    """
    read = Scripts(client)["migrate_read"]
    limit = MAX_PAYLOAD_BYTES
    offset = 0
    if kind in ("list", "zset"):
        while True:
            start = kept[0] if move else offset
            if kind == "list" and from_head:
                raw = _members(await read(keys=[key], args=["list", start, start + batch - 1,
                                                            limit]))
            elif kind == "list":
                raw = _members(reversed(await read(
                    keys=[key], args=["list", -(start + batch), -(start + 1), limit])))
            else:
                # PriorityQueue pops the lowest score (-priority); a start-URL zset the highest.
                mode = "zset" if from_head else "zrev"
                pairs = await read(keys=[key], args=[mode, start, start + batch - 1, limit])
                raw = list(zip(_members(pairs[::2]), (float(s) for s in pairs[1::2]),
                               strict=True))
            if not raw:
                return
            if kind == "list":
                yield [(m, None, offset + i) for i, m in enumerate(raw)]
            else:
                yield [(m, s, offset + i) for i, (m, s) in enumerate(raw)]
            offset += len(raw)
    else:  # set
        cursor = b"0"
        while True:
            cursor, members = await read(keys=[key], args=["set", cursor, batch, limit])
            if members:
                yield [(m, None, offset + i) for i, m in enumerate(_members(members))]
                offset += len(members)
            if int(cursor) == 0:
                return


def _serves_from_head(kind: str, what: str, lifo: bool) -> bool:
    """Which end scrapy-redis pops first, so tasks enter the stream in the order it would
    have served them."""
    if what == REQUESTS:
        # Both list queues LPUSH; FifoQueue RPOPs, LifoQueue LPOPs. PriorityQueue takes the
        # lowest score (-priority) first.
        return lifo if kind == "list" else True
    # RedisSpider reads start-URL lists with LRANGE 0.., sorted sets highest score first.
    return kind != "zset"


def _convert(member: Any, score: float | None, what: str, origin: Origin,
             encoding: str) -> Converted:
    """One entry as a task; raises :class:`RejectedPayload` with the reason it cannot be."""
    if isinstance(member, int):  # too large: the read script sent its length, not the entry
        raise RejectedPayload(f"entry is {member} bytes, larger than {MAX_PAYLOAD_BYTES}")
    if what == REQUESTS:
        return request_dict_to_task(loads_request(member), origin)
    if score is not None and not math.isfinite(score):
        raise RejectedPayload(f"score {score} is not a finite priority")
    priority = round(score) if score is not None else 0
    return start_url_to_task(member, origin, priority, encoding)


def _reason(exc: Exception) -> str:
    """The reason a rejection prints: the entry's own text can reach it (a URL, a class
    name), so control characters are escaped and the length is bounded."""
    text = str(exc) if isinstance(exc, (RejectedPayload, TaskError)) else (
        f"cannot be converted ({type(exc).__name__}: {exc})")
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:MAX_REASON])
    return text if len(str(exc)) <= MAX_REASON else text + "..."


async def _remove(client: AsyncRedis, key: str, kind: str, from_head: bool,
                  members: list[Any]) -> int:
    if not members:
        return 0
    async with client.pipeline(transaction=False) as pipe:
        for member in members:
            if kind == "list":
                # One occurrence per migrated entry, from the end it was read at.
                pipe.lrem(key, 1 if from_head else -1, member)
            elif kind == "zset":
                pipe.zrem(key, member)
            else:
                pipe.srem(key, member)
        return sum(int(n) for n in await pipe.execute())


async def migrate(
    client: AsyncRedis, writer: TaskWriter, source: ScrapyRedisSource, origin: Origin, *,
    move: bool = False, dry_run: bool = False, batch_size: int = 500,
    on_reject: Callable[[RefusedEntry], None] | None = None,
    max_backlog: int | None = None, on_wait: Callable[[int], None] | None = None,
) -> MigrationSummary:
    """Migrate ``source``'s waiting requests, then its start URLs; see the module docstring.

    ``client`` must return bytes (``decode_responses=False``): queue entries are pickles.
    """
    if move and dry_run:
        raise ValueError("move and dry_run exclude each other")
    summary = MigrationSummary(dry_run=dry_run, move=move)

    def reject(rejection: RefusedEntry) -> None:
        summary.rejected += 1
        if on_reject is not None:
            on_reject(rejection)

    for key, what in ((source.queue_key, REQUESTS), (source.start_urls_key, START_URLS)):
        kind_raw: Any = await client.type(key)
        kind = text_of(kind_raw, "strict")
        if kind == "none":
            continue
        if kind not in ("list", "zset", "set"):
            reject(RefusedEntry(key, None, f"a Redis {kind}, not a list, set or sorted set: "
                                        "left as it is"))
            continue
        from_head = _serves_from_head(kind, what, source.lifo)
        logger.info("migrating %s from %s (a %s)", what, key, kind)
        kept = [0]
        async for batch in _entries(client, key, kind, batch_size, move, from_head, kept):
            converted: list[tuple[Any, Converted, Encoded]] = []
            for member, score, position in batch:
                try:
                    item = _convert(member, score, what, origin, source.encoding)
                    # Encoded now, so a task the writer refuses is this entry's rejection; a
                    # dont_filter request is not deduplicated, as scrapy-redis schedules it.
                    encoded = writer.encode(item.task, not item.task.dont_filter)
                except Exception as exc:
                    # One entry, never the migration: anything unforeseen is logged in full
                    # and the entry stays where it is, like every rejected one.
                    if not isinstance(exc, (RejectedPayload, TaskError)):
                        logger.exception("%s entry %d: cannot be converted", key, position)
                    kept[0] += 1
                    reject(RefusedEntry(key, position, _reason(exc)))
                    continue
                converted.append((member, item, encoded))
                summary.meta_dropped += bool(item.dropped_meta)
            if what == REQUESTS:
                summary.requests += len(batch)
            else:
                summary.start_urls += len(batch)
            if dry_run or not converted:
                continue
            if max_backlog is not None:
                await writer.wait_for_room(max_backlog, on_wait)
            result = await writer.enqueue([encoded for _, _, encoded in converted])
            summary.enqueued += result.enqueued
            summary.duplicates += result.duplicates
            if move:  # only now: the tasks of this batch are on the stream
                removed = await _remove(client, key, kind, from_head,
                                        [m for m, _, _ in converted])
                # Fewer than asked when a scrapy-redis worker popped some meanwhile: fine.
                summary.removed += removed
    return summary

"""Stream shards on one Redis or a Redis Cluster: the recorded shard count, and script calls
that redis-py cannot pipeline on a cluster.

A namespace records its ``METEORSEED_STREAM_SHARDS`` in ``<ns>:shards`` the first time a worker
or a writer uses it. A site's shard is ``crc32(site_id) % shards``, so another count would look
for every site's tasks, dedup roots and dead letters in another shard: a process configured with
a different count is refused (drain or migrate first, see docs/cluster.md). Operator tools
(``meteorseed status``, ``dead``, ``serve``) read the recorded count instead of a setting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio
import redis.cluster

from meteorseed_scrapy.queue.keys import SHARDS_SETTING, KeyLayout
from meteorseed_scrapy.queue.plumbing.scripts import ScriptPipeline

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript
    from typing_extensions import TypeIs

    from meteorseed_scrapy.queue.plumbing.connection import AnyRedis, AsyncRedis, SyncRedis


class ShardMismatch(ValueError):
    """The namespace was set up with another shard count or layout."""


def is_cluster(client: AnyRedis
               ) -> TypeIs[redis.asyncio.RedisCluster | redis.cluster.RedisCluster]:
    """True for redis-py's cluster clients (sync or asyncio)."""
    return isinstance(client, (redis.asyncio.RedisCluster, redis.cluster.RedisCluster))


def _record(keys: KeyLayout) -> str:
    # "4" for a layout that tags its shard keys, "1u" for the historical untagged one.
    return str(keys.shards) if keys.tagged else f"{keys.shards}u"


def _compare(keys: KeyLayout, stored: str | bytes | None) -> None:
    if isinstance(stored, bytes):
        stored = stored.decode()
    if stored is None or stored == _record(keys):
        return
    raise ShardMismatch(
        f"{SHARDS_SETTING}={keys.shards}{' (cluster layout)' if keys.cluster else ''}, but "
        f"namespace {keys.namespace!r} was set up with {stored.rstrip('u')} shard(s)"
        f"{'' if stored.endswith('u') else ' (tagged layout)'} ({keys.shard_count}): "
        "drain the namespace or migrate it before changing the shard count"
    )


async def check_shard_count(client: AsyncRedis, keys: KeyLayout) -> None:
    """Record the namespace's shard count if none is, else refuse a different one."""
    await client.set(keys.shard_count, _record(keys), nx=True)
    _compare(keys, await client.get(keys.shard_count))


def stored_shards(client: SyncRedis, keys: KeyLayout) -> KeyLayout:
    """``keys`` with the shard count recorded for its namespace (sync client), for operator
    tools that are not configured with one; ``keys`` itself when none is recorded."""
    stored = client.get(keys.shard_count)
    if isinstance(stored, bytes):
        stored = stored.decode()
    if not stored or not stored.rstrip("u").isdigit():
        return keys
    return KeyLayout(keys.namespace, int(stored.rstrip("u")), keys.cluster)


async def call_scripts(client: AsyncRedis, script: AsyncScript,
                       calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]) -> list[Any]:
    """Run ``script`` once per ``(keys, args)``: pipelined on one Redis, concurrently on a
    cluster (redis-py refuses EVALSHA in a cluster pipeline; each call stays in one slot)."""
    if len(calls) == 1:
        keys, args = calls[0]
        return [await script(keys=keys, args=args)]
    if is_cluster(client):
        return list(await asyncio.gather(*(script(keys=k, args=a) for k, a in calls)))
    async with client.pipeline(transaction=False) as pipe:
        batch = ScriptPipeline(pipe)
        for keys, args in calls:
            batch.call(script, keys, args)
        return await batch.execute()

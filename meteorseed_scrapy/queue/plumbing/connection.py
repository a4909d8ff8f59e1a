"""Redis clients from a ``METEORSEED_REDIS_URL``: one server, or a Redis Cluster.

* ``redis://``, ``rediss://``, ``unix://``: one server (redis-py's ``Redis``).
* ``redis+cluster://[user:password@]host:port[,host:port...][/0]`` (``rediss+cluster://`` for
  TLS): a Redis Cluster (redis-py's ``RedisCluster``), started from any of the listed nodes; the
  client learns the others and the slot map from the first one that answers. Query parameters
  (``?socket_timeout=5``) apply as with ``redis://``. A cluster has database 0 only.

The cluster is chosen by the URL alone, so ``METEORSEED_REDIS_URL``, env ``REDIS_URL`` and
``--redis-url`` of the CLI all carry it without another setting. See docs/cluster.md for what
works on a cluster so far.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.cluster
import redis.client
import redis.cluster
from redis.cluster import ClusterNode
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

#: The clients made here, by kind; the rest of the package names them by these aliases only.
#: A blocking client (the CLI, the API's threads, the keep-alive thread): one server or a cluster.
SyncRedis: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
#: An asyncio client (the worker's reactor side, the API, the seeder): one server or a cluster.
AsyncRedis: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
#: Either kind, where only what both have is used (``register_script``, ``isinstance``).
AnyRedis: TypeAlias = "SyncRedis | AsyncRedis"
#: The pipelines of each (a cluster's is non-transactional and split per node).
SyncPipeline: TypeAlias = "redis.client.Pipeline | redis.cluster.ClusterPipeline"
AsyncPipeline: TypeAlias = "redis.asyncio.client.Pipeline | redis.asyncio.cluster.ClusterPipeline"

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SETTING = "METEORSEED_REDIS_URL"


@dataclass(frozen=True)
class ClusterTarget:
    """A parsed cluster URL: ``node_url`` (the first node, as a plain URL) and every node."""

    node_url: str
    nodes: tuple[tuple[str, int], ...]


#: What "Redis is unreachable" is, everywhere (a worker pauses, a command or the API says so):
#: redis-py's connection and timeout errors (it wraps the socket's own OSError in them).
REDIS_DOWN: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)
#: What "Redis failed" is, where the caller waits and tries again whatever the cause: Redis
#: unreachable, or a command refused (out of memory, a key of the wrong type, a script's
#: error); the socket's own errors, and asyncio's timeout (not an OSError before 3.11).
REDIS_FAILURES: tuple[type[Exception], ...] = (RedisError, OSError, asyncio.TimeoutError)


def out_of_memory(exc: BaseException) -> bool:
    """Redis refused a write above its ``maxmemory``: redis-py's OutOfMemoryError (whose text
    has lost Redis's ``OOM`` code), or a script's error quoting the ``-OOM`` (Redis 6.2)."""
    return isinstance(exc, OutOfMemoryError) or (
        isinstance(exc, ResponseError) and "OOM command not allowed" in str(exc))


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def parse_cluster_url(url: str, setting: str = SETTING) -> ClusterTarget:
    """Split ``redis+cluster://a:1,b:2/0`` into the first node's URL and all nodes; a
    :class:`ValueError` names ``setting`` and what is wrong."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if not sep or plain is None:
        raise ValueError(f"{setting}: not a cluster URL (redis+cluster://host:port): {url!r}")
    parts = urlsplit(f"{plain}://{rest}")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{setting}: cluster node {item!r} is not host:port in {url!r}")
        nodes.append((host.strip("[]"), int(port)))
    db = parts.path.strip("/")
    if db not in ("", "0"):
        raise ValueError(f"{setting}: a Redis Cluster has database 0 only, not {db!r}")
    first, first_port = nodes[0]
    if ":" in first:  # IPv6
        first = f"[{first}]"
    netloc = f"{userinfo}{at}{first}:{first_port}"
    node_url = urlunsplit((plain, netloc, "/0", parts.query, ""))
    return ClusterTarget(node_url, tuple(nodes))


def check_redis_url(url: str) -> None:
    """Raise :class:`ValueError` for a URL neither client could use."""
    if is_cluster_url(url):
        parse_cluster_url(url)
    else:
        redis.connection.parse_url(url)


def async_client(url: str, **kwargs: Any) -> AsyncRedis:
    """A ``redis.asyncio`` client: ``RedisCluster`` for a cluster URL, else ``Redis``.

    ``kwargs`` are redis-py client options (``decode_responses``, ``socket_timeout``, ...).
    """
    if not is_cluster_url(url):
        return redis.asyncio.Redis.from_url(url, **kwargs)
    target = parse_cluster_url(url)
    from redis.asyncio.cluster import ClusterNode as AsyncClusterNode

    others = [AsyncClusterNode(h, p) for h, p in target.nodes[1:]]
    return redis.asyncio.RedisCluster.from_url(target.node_url, startup_nodes=others or None,
                                               **kwargs)


def sync_client(url: str, **kwargs: Any) -> SyncRedis:
    """A blocking client (the CLI, threads off the reactor): ``RedisCluster`` or ``Redis``."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **kwargs)
    target = parse_cluster_url(url)
    others = [ClusterNode(h, p) for h, p in target.nodes[1:]]
    return redis.RedisCluster.from_url(target.node_url, startup_nodes=others or None, **kwargs)


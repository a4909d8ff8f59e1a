"""Start a real, throwaway Redis Cluster of masters (no replicas) on loopback.

``with LocalCluster() as cluster: cluster.url`` gives a ``redis+cluster://`` URL naming every
node (see :mod:`meteorseed_scrapy.queue.plumbing.connection`). Each node is a :class:`RedisServer`
started with ``--cluster-enabled yes`` in its own directory; ``redis-cli --cluster create``
assigns the 16384 slots; the cluster is ready once every node reports ``cluster_state:ok`` and
sees every node.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from meteorseed_scrapy.testing.redis_server import RedisServer, find_redis_server

SLOTS = 16384
BUS_OFFSET = 10_000  # Redis's default cluster bus port: the client port + 10000


def find_redis_cli() -> str:
    """``redis-cli`` beside the ``redis-server`` in use, else the one on PATH."""
    beside = Path(find_redis_server()).with_name("redis-cli")
    found = str(beside) if beside.exists() else shutil.which("redis-cli")
    if not found:
        raise RuntimeError("no redis-cli: install Debian's redis-tools (redis-server pulls it in)")
    return found


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_port(taken: set[int]) -> int:
    """A port free on loopback whose bus port (+10000) is free too (Redis 6.2 has no
    ``cluster-port`` setting, so the default bus port is kept)."""
    for _ in range(500):
        port = random.randint(20_000, 55_000 - BUS_OFFSET)
        if {port, port + BUS_OFFSET} & taken:
            continue
        if _bindable(port) and _bindable(port + BUS_OFFSET):
            return port
    raise RuntimeError("no free pair of loopback ports for a cluster node")


def _info(text: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


class LocalCluster:
    """``masters`` cluster nodes on free loopback ports, files under one temp directory."""

    def __init__(self, masters: int = 3, workdir: str | None = None) -> None:
        if masters < 3:
            raise ValueError(f"masters: redis-cli --cluster create needs at least 3, got {masters}")
        self.masters = masters
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="meteorseed-cluster-")
        self.cli = find_redis_cli()
        self.nodes: list[RedisServer] = []

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """Every node, so a client can start from any of them."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/0"

    def start(self, timeout: float = 60.0) -> LocalCluster:
        taken: set[int] = set()
        try:
            for _ in range(self.masters):
                port = free_cluster_port(taken)
                taken |= {port, port + BUS_OFFSET}
                node_dir = Path(self.workdir) / str(port)
                node_dir.mkdir(parents=True, exist_ok=True)
                node = RedisServer(port=port, workdir=str(node_dir), extra=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "5000",
                ])
                self.nodes.append(node)
                node.start()
            create = subprocess.run(
                [self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout,
            )
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-2000:]}"
                                   f"{create.stderr[-2000:]}")
            self._wait_ok(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def cluster_info(self, port: int) -> dict[str, str]:
        reply = subprocess.run([self.cli, "-h", "127.0.0.1", "-p", str(port), "cluster", "info"],
                               capture_output=True, text=True, timeout=10)
        return _info(reply.stdout)

    def _wait_ok(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        want = {"cluster_state": "ok", "cluster_slots_assigned": str(SLOTS),
                "cluster_known_nodes": str(self.masters)}
        infos: list[dict[str, str]] = []
        while time.monotonic() < deadline:
            infos = [self.cluster_info(p) for p in self.ports]
            if all(want.items() <= info.items() for info in infos):
                return
            time.sleep(0.1)
        raise RuntimeError(f"cluster not ok within {timeout}s: {infos}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.nodes = []
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

"""Harness of ``politeness.py``: Redis, the fault site, tasks, and real ``scrapy crawl`` workers.

Everything runs on loopback: a throwaway Redis (``RedisServer``), the :class:`FaultSite` in this
process (its threads record what the *server* saw), and worker processes of the ``probe`` spider
of ``tests/e2e_project`` (the add-on via ``ADDONS``; one item per page, unique_key = path+query),
configured with ``-s`` settings. Each bench uses a fresh namespace and a fresh SQLite store.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
import redis.asyncio as aioredis

import meteorseed_scrapy
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.faults import FaultSite
from meteorseed_scrapy.testing.polling import poll_until
from meteorseed_scrapy.testing.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[1]
PROJECT = REPO / "tests" / "e2e_project"
#: Workers import the package from where this process did (``PYTHONPATH=/other/checkout``
#: benchmarks that checkout; by default this repo).
SOURCE = Path(meteorseed_scrapy.__file__).resolve().parents[1]
SITE = "a"  #: the fault site's path prefix the benches use
SITE_ID = "faults_a"  #: the tasks' site_id (what the quota, cap and breaker key on)

#: Settings every worker gets (a bench adds or overrides its own).
WORKER_SETTINGS: dict[str, Any] = {
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
    "DOWNLOAD_TIMEOUT": 20,
    "LOG_LEVEL": "INFO",
    "METEORSEED_IDLE_CLOSE": 3,
}


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def enabled_downloader_middlewares(self) -> list[str]:
        """The class paths of Scrapy's "Enabled downloader middlewares" log line."""
        match = re.search(r"Enabled downloader middlewares:\n(\[.*?\])", self.log(), re.S)
        return re.findall(r"'([\w.]+)'", match.group(1)) if match else []

    def errors(self) -> list[str]:
        return [line for line in self.log().splitlines()
                if " ERROR: " in line or line.startswith("Traceback")]


@dataclass
class Bench:
    """One benchmark run: ``with Bench("quota") as bench: bench.enqueue(...); bench.workers(4)``."""

    label: str
    keep: bool = False
    site: FaultSite = field(default_factory=FaultSite)
    namespace: str = field(default_factory=lambda: f"bench{uuid.uuid4().hex[:10]}")
    redis: RedisServer | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="politeness-")))
    running: list[Worker] = field(default_factory=list)
    tasks: int = 0
    worker_cpu: float = 0.0  #: CPU seconds of the workers reaped by :meth:`wait_workers`

    def __enter__(self) -> Bench:
        self.redis = RedisServer().start()
        self.site.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for worker in self.running:
            worker.kill()
        self.site.stop()
        if self.redis is not None:
            self.redis.close()
        if exc_type is None and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            print(f"[{self.label}] logs kept in {self.workdir}", file=sys.stderr)

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    @property
    def store(self) -> Path:
        return self.workdir / "items.db"

    def urls(self, n: int, prefix: str = SITE, tag: str = "p") -> list[str]:
        return [f"{self.site.url}/{prefix}/{tag}{i}" for i in range(n)]

    def enqueue(self, urls: Iterable[str], site_id: str = SITE_ID) -> int:
        tasks = [ExecTask.create(seed_id="politeness", site_id=site_id, url=u) for u in urls]

        async def run() -> None:
            client = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
            try:
                await TaskWriter(client, KeyLayout(self.namespace)).add(tasks)
            finally:
                await client.aclose()

        asyncio.run(run())
        self.tasks += len(tasks)
        return len(tasks)

    def workers(self, n: int, **settings: Any) -> list[Worker]:
        started = [self.start_worker(f"w{len(self.running) + 1}", **settings) for _ in range(n)]
        return started

    def start_worker(self, name: str, **settings: Any) -> Worker:
        log_path = self.workdir / f"{name}.log"
        values: dict[str, Any] = {
            **WORKER_SETTINGS,
            "METEORSEED_REDIS_URL": self.redis_url,
            "METEORSEED_NAMESPACE": self.namespace,
            "METEORSEED_STORE_URI": f"sqlite:///{self.store}",
            "METEORSEED_CONSUMER": name,
            "LOG_FILE": str(log_path),
            **settings,
        }
        args = [sys.executable, "-m", "scrapy.cmdline", "crawl", "probe"]
        for key, value in values.items():
            args += ["-s", f"{key}={json.dumps(value) if isinstance(value, dict) else value}"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SOURCE), str(PROJECT)]))
        proc = subprocess.Popen(args, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        worker = Worker(name, proc, log_path)
        self.running.append(worker)
        return worker

    def wait_workers(self, timeout: float) -> bool:
        """Wait for every worker to exit (they close after METEORSEED_IDLE_CLOSE idle seconds);
        kill them at ``timeout``. True when they all exited by themselves."""
        deadline = time.monotonic() + timeout
        before = _children_cpu()
        for worker in self.running:
            try:
                worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        clean = all(w.proc.poll() is not None for w in self.running)
        if not clean:
            print(f"[{self.label}] workers still running after {timeout:.0f}s: killed",
                  file=sys.stderr)
        for worker in self.running:
            worker.kill()
        self.worker_cpu += _children_cpu() - before  # Redis, also a child, is still running
        errors = [f"{w.name}: {line}" for w in self.running for line in w.errors()]
        if errors:
            print(f"[{self.label}] {len(errors)} error lines in worker logs, first: {errors[0]}",
                  file=sys.stderr)
        return clean

    def stored(self) -> int:
        if not self.store.exists():
            return 0
        with sqlite3.connect(self.store) as conn:
            try:
                return int(conn.execute("SELECT COUNT(*) FROM items").fetchone()[0])
            except sqlite3.OperationalError:
                return 0

    def dead(self) -> int:
        client = redis.Redis.from_url(self.redis_url)
        try:
            return int(client.xlen(KeyLayout(self.namespace).dead))
        finally:
            client.close()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.005) -> Any:
    """The predicate's first truthy value, or None when ``timeout`` passed first."""
    return poll_until(predicate, timeout, interval)


def window_rates(arrivals: list[float], width: float) -> list[float]:
    """Arrivals per second in consecutive windows of ``width`` seconds from the first one."""
    if not arrivals:
        return []
    start, counts = arrivals[0], [0] * (int((arrivals[-1] - arrivals[0]) // width) + 1)
    for t in arrivals:
        counts[int((t - start) // width)] += 1
    return [c / width for c in counts]

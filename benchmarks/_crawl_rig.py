"""Shared harness of the benchmark scripts: the site process, worker processes, small helpers.

Everything runs on loopback: a throwaway Redis (``RedisServer``), the benchmark site
(``bench_site.py``) in its own process, and ``scrapy crawl`` workers of ``bench_project/``.

Workers import ``meteorseed_scrapy`` from this repo, or from the source tree named by the
``METEORSEED_BENCH_SRC`` environment variable (e.g. a ``git archive`` of another commit, to
compare two versions with the same harness).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis.asyncio as aioredis

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROJECT = HERE / "bench_project"
SRC = os.environ.get("METEORSEED_BENCH_SRC") or str(REPO)
sys.path.insert(0, SRC)  # the harness enqueues with the same code the workers run

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter  # noqa: E402
from meteorseed_scrapy.queue.keys import KeyLayout  # noqa: E402
from meteorseed_scrapy.task.exec_task import ExecTask  # noqa: E402
from meteorseed_scrapy.testing.polling import wait_for  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402


@contextlib.contextmanager
def bench_rig(keep: str | None, prefix: str,
              linger: float = 0.0) -> Iterator[tuple[Path, RedisServer, BenchSite]]:
    """A work directory (``keep``, else a temporary one removed at the end, ``linger`` seconds
    after the workers are gone), a throwaway Redis server and the benchmark site."""
    workdir = Path(keep or tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with RedisServer() as server, BenchSite() as site:
            yield workdir, server, site
    finally:
        if not keep:
            time.sleep(linger)
            shutil.rmtree(workdir, ignore_errors=True)


class BenchSite:
    """``with BenchSite() as site: site.url`` — ``bench_site.py`` in a separate process."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> BenchSite:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "bench_site.py"), "--port", "0"],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://127.0.0.1:"):
            self.close()
            raise RuntimeError("the benchmark site did not start")
        return self

    def hits(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/hits", timeout=10) as reply:
            return dict(json.load(reply))

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    timing_path: Path

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(
                f"worker {self.name} did not finish within {timeout:.0f}s; log tail:\n"
                + self.log()[-3000:]
            ) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def timing(self) -> dict[str, Any]:
        if not self.timing_path.exists():
            raise RuntimeError(f"worker {self.name} wrote no timing file; log tail:\n"
                               + self.log()[-3000:])
        return dict(json.loads(self.timing_path.read_text()))


def start_worker(workdir: Path, name: str, spider: str, settings_module: str,
                 settings: dict[str, Any], spider_args: dict[str, str] | None = None,
                 wrapper: Sequence[str] = ()) -> Worker:
    """``scrapy crawl <spider>`` of the bench project with ``-s`` settings, logging to a file."""
    log_path = workdir / f"{name}.log"
    timing_path = workdir / f"{name}.timing.json"
    values = {"LOG_FILE": str(log_path), "BENCH_TIMING_FILE": str(timing_path), **settings}
    args = [*wrapper, sys.executable, "-m", "scrapy.cmdline", "crawl", spider]
    for key, value in values.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        args += ["-s", f"{key}={value}"]
    for key, value in (spider_args or {}).items():
        args += ["-a", f"{key}={value}"]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([SRC, str(PROJECT)]),
        SCRAPY_SETTINGS_MODULE=settings_module,
    )
    proc = subprocess.Popen(args, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return Worker(name, proc, log_path, timing_path)


def enqueue_tasks(redis_url: str, namespace: str, urls: Iterable[str],
                  site_id: str = "bench") -> int:
    """Enqueue one MeteorSeed exec task per URL with TaskWriter; returns how many went in."""
    tasks = [ExecTask.create(seed_id="bench", site_id=site_id, url=u) for u in urls]

    async def run() -> int:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            result = await TaskWriter(client, KeyLayout(namespace)).add(tasks)
            return result.enqueued
        finally:
            await client.aclose()

    return asyncio.run(run())


def source_label() -> str:
    """Which ``meteorseed_scrapy`` the workers run: this repo's commit (and whether the working
    tree differs from it), or the ``METEORSEED_BENCH_SRC`` directory."""
    if str(REPO) != SRC:
        return f"meteorseed_scrapy from {SRC}"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                                capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "meteorseed_scrapy"], cwd=REPO,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"meteorseed_scrapy from {REPO}"
    return f"meteorseed_scrapy at {commit}" + (" + uncommitted changes" if dirty else "")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def log_errors(worker: Worker) -> list[str]:
    return [line for line in worker.log().splitlines()
            if " ERROR: " in line or "Traceback" in line]


def wait_until(predicate: Any, timeout: float, interval: float = 0.05) -> Any:
    return wait_for(predicate, timeout, interval, error=RuntimeError)

"""Real `scrapy crawl` worker processes for end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.clients import run_with_client
from tests.subprocess_env import python_path

REPO = Path(__file__).resolve().parents[1]
PROJECT = Path(__file__).resolve().parent / "e2e_project"


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    stats_path: Path

    def __post_init__(self) -> None:
        _STARTED.append(self)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            tail = self.log()[-4000:]
            raise AssertionError(f"worker {self.name} did not finish:\n{tail}") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stats(self) -> dict[str, Any]:
        return json.loads(self.stats_path.read_text()) if self.stats_path.exists() else {}

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


_STARTED: list[Worker] = []


def reap_workers() -> list[str]:
    """Kill the workers a test started and left running (it failed before it stopped them: a
    worker left to run would load every later test); their names."""
    left = [w for w in _STARTED if w.proc.poll() is None]
    for worker in left:
        worker.kill()
    _STARTED.clear()
    return [w.name for w in left]


def start_worker(tmp_path: Path, redis_url: str, namespace: str, *, name: str = "w1",
                 store: Path | None = None, spider_args: dict[str, str] | None = None,
                 spider: str = "probe", **settings: Any) -> Worker:
    store = store or tmp_path / "items.db"
    log_path = tmp_path / f"{name}.log"
    stats_path = tmp_path / f"{name}.stats.json"
    base = {
        "METEORSEED_REDIS_URL": redis_url,
        "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_STORE_URI": f"sqlite:///{store}",
        "METEORSEED_CONSUMER": name,
        "METEORSEED_IDLE_CLOSE": 2,
        "LOG_FILE": str(log_path),
        "PROBE_STATS_FILE": str(stats_path),
    }
    base.update(settings)
    args = [sys.executable, "-m", "scrapy.cmdline", "crawl", spider]
    for key, value in base.items():
        args += ["-s", f"{key}={value}"]
    for key, value in (spider_args or {}).items():
        args += ["-a", f"{key}={value}"]
    env = dict(os.environ, PYTHONPATH=python_path(REPO, PROJECT))
    env.pop("SCRAPY_SETTINGS_MODULE", None)  # the probe project's scrapy.cfg decides
    proc = subprocess.Popen(args, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return Worker(name, proc, log_path, stats_path)


@contextlib.contextmanager
def running(cmd: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """``cmd`` running, its stdout and stderr piped as text; killed if still running at the
    block's end (a test that failed before it stopped it)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def terminate(proc: subprocess.Popen[str], timeout: float = 30) -> str:
    """SIGTERM ``proc`` and wait for it to exit; its stderr."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=timeout)
    return err


def add_tasks(redis_url: str, namespace: str, tasks: list[ExecTask], *, dedup: bool = True
              ) -> list[ExecTask]:
    """Put ``tasks`` on the namespace's streams, as seed-expand would."""
    keys = KeyLayout(namespace)
    run_with_client(redis_url, lambda client: TaskWriter(client, keys).add(tasks, dedup=dedup))
    return tasks


def enqueue(redis_url: str, namespace: str, urls: Iterable[str], *, site_id: str = "probe",
            seed_id: str = "s1", dedup: bool = True, callback: str | None = None
            ) -> list[ExecTask]:
    tasks = [ExecTask.create(seed_id=seed_id, site_id=site_id, url=u, callback=callback)
             for u in urls]
    return add_tasks(redis_url, namespace, tasks, dedup=dedup)


def stored_docs(store: Path) -> dict[str, dict[str, Any]]:
    if not store.exists():
        return {}
    with sqlite3.connect(store) as conn:
        try:
            rows = conn.execute("SELECT _id, doc FROM items").fetchall()
        except sqlite3.OperationalError:  # the worker has not created the table yet
            return {}
        return {row[0]: json.loads(row[1]) for row in rows}


def foreign_tracebacks_removed(log: str) -> str:
    """The log without the records of libraries that log a traceback and go on.

    tldextract (Scrapy's cookie middleware) logs one when it cannot fetch the
    public suffix list on an offline machine, then falls back to its snapshot,
    as it does under stock Scrapy.
    """
    records: list[str] = []
    for line in log.splitlines(keepends=True):
        if records and not line[:4].isdigit():
            records[-1] += line
        else:
            records.append(line)
    return "".join(r for r in records if "[tldextract] " not in r.partition("\n")[0])

"""End to end through scrapyd: deploy ``example_project`` with ``scrapyd-deploy``, run workers with
``schedule.json``, stop one with ``cancel.json`` while tasks are in flight.

Everything runs on loopback: a real scrapyd (its own config, eggs, logs and dbs in a temp dir), a
real Redis (tests/conftest.py), a slow demo site, a SQLite store.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.demo_pages import Reply
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import free_port
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import stored_docs

pytestmark = pytest.mark.e2e

EXAMPLE_PROJECT = Path(__file__).resolve().parents[1] / "example_project"
PROJECT = "demo_project"
ARTICLES = 160
HANDED_BACK_IDLE_MS = 3600 * 1000  # hand-back sets idle to CLAIM_IDLE + 3600 s


class SlowNews(DemoSite):
    """The demo site whose articles take ``delay`` seconds, counting requests being served."""

    def __init__(self, delay: float) -> None:
        super().__init__(sections=["news"], news_pages=ARTICLES // 10)
        self.delay = delay
        self.active = 0
        self._active_lock = threading.Lock()

    def handle(self, target: str) -> Reply:
        if not target.startswith("/news/article/"):
            return super().handle(target)
        with self._active_lock:
            self.active += 1
        try:
            time.sleep(self.delay)
            return super().handle(target)
        finally:
            with self._active_lock:
                self.active -= 1


class Scrapyd:
    """A scrapyd process on a free loopback port, with everything it writes under ``home``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Scrapyd:
        self.home.mkdir(parents=True, exist_ok=True)
        # scrapyd reads ./scrapyd.conf (it is started in ``home``); its workers inherit the cwd.
        (self.home / "scrapyd.conf").write_text(
            "[scrapyd]\n"
            f"bind_address = 127.0.0.1\nhttp_port = {self.port}\n"
            f"eggs_dir = {self.home / 'eggs'}\nlogs_dir = {self.home / 'logs'}\n"
            f"dbs_dir = {self.home / 'dbs'}\nitems_dir =\n"
            "max_proc = 2\npoll_interval = 0.2\n",
            encoding="utf-8",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scrapyd", "--pidfile=", "-l", str(self.home / "scrapyd.log")],
            cwd=self.home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for(self._up, 60, 0.2)
        return self

    def _up(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log()[-3000:]
        try:
            return self.get("daemonstatus.json")["status"] == "ok"
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        path = self.home / "scrapyd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def get(self, endpoint: str, **params: str) -> dict[str, Any]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{endpoint}{query}", timeout=30) as reply:
            data: dict[str, Any] = json.loads(reply.read())
        return data

    def post(self, endpoint: str, fields: list[tuple[str, str]]) -> dict[str, Any]:
        body = urllib.parse.urlencode(fields).encode()
        with urllib.request.urlopen(f"{self.url}{endpoint}", body, timeout=30) as reply:
            data: dict[str, Any] = json.loads(reply.read())
        assert data["status"] == "ok", data
        return data

    def schedule(self, spider: str, settings: dict[str, Any]) -> str:
        fields = [("project", PROJECT), ("spider", spider)]
        fields += [("setting", f"{k}={v}") for k, v in settings.items()]
        return str(self.post("schedule.json", fields)["jobid"])

    def job_state(self, job: str) -> str:
        jobs = self.get("listjobs.json", project=PROJECT)
        for state in ("pending", "running", "finished"):
            if any(j["id"] == job for j in jobs[state]):
                return state
        return "unknown"

    def job_log(self, spider: str, job: str) -> str:
        path = self.home / "logs" / PROJECT / spider / f"{job}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def scrapyd(tmp_path: Path) -> Iterator[Scrapyd]:
    server = Scrapyd(tmp_path / "scrapyd").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def slow_news() -> Iterator[SlowNews]:
    with SlowNews(delay=0.5) as site:
        yield site


def _stats(log: str) -> dict[str, int]:
    """The numeric stats of a job's final stats dump."""
    dump = log.rsplit("Dumping Scrapy stats:", 1)
    assert len(dump) == 2, f"no stats dump in the job log:\n{log[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"'([^']+)': (\d+)[,}]", dump[1])}


def _pending(r: redis.Redis, keys: KeyLayout, consumer: str) -> list[dict[str, Any]]:
    return list(r.xpending_range(keys.stream, keys.group, "-", "+", 10_000, consumername=consumer))


# cancel.json sends SIGINT unless told otherwise; SIGTERM is what systemd and Kubernetes send.
@pytest.mark.parametrize("signal", [None, "TERM"], ids=["cancel-sigint", "cancel-sigterm"])
def test_deploy_schedule_cancel_and_finish_with_another_job(
    tmp_path: Path, scrapyd: Scrapyd, slow_news: SlowNews, redis_url: str, namespace: str,
    sync_redis: redis.Redis, signal: str | None,
) -> None:
    keys = KeyLayout(namespace)
    project = tmp_path / "project"  # a copy: scrapyd-deploy writes build files next to setup.py
    shutil.copytree(EXAMPLE_PROJECT, project,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))

    deploy = subprocess.run(
        [str(Path(sys.executable).with_name("scrapyd-deploy")), "fleet", "-v", "e2e"],
        cwd=project, env={**_env(), "SCRAPYD_URL": scrapyd.url},
        capture_output=True, text=True, timeout=180,
    )
    assert deploy.returncode == 0, deploy.stderr + deploy.stdout
    assert scrapyd.get("listversions.json", project=PROJECT)["versions"] == ["e2e"]
    assert "demo" in scrapyd.get("listspiders.json", project=PROJECT)["spiders"]

    urls = [f"{slow_news.url}/news/article/{i}" for i in range(1, ARTICLES + 1)]
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"seed_id": "scrapyd-e2e", "site_id": "demo_news",
                                 "task_type": "url_list", "payload": {"urls": urls}}) + "\n")
    expand = subprocess.run(
        [sys.executable, "-m", "scrapy", "seed-expand", str(seeds),
         "-s", f"METEORSEED_REDIS_URL={redis_url}", "-s", f"METEORSEED_NAMESPACE={namespace}"],
        cwd=project, env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert expand.returncode == 0, expand.stderr
    assert sync_redis.xlen(keys.stream) == ARTICLES

    store = tmp_path / "items.db"
    common = {
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_STORE_URI": f"sqlite:///{store}",
        "METEORSEED_SITES_DIR": project / "sites",
        # Far longer than the test may take: the second job gets the first one's unfinished
        # tasks only if they were handed back, never by waiting for them to go idle.
        "METEORSEED_CLAIM_IDLE": 600,
        "CONCURRENT_REQUESTS": 8,
    }
    first = scrapyd.schedule("demo", {**common, "METEORSEED_CONSUMER": "scrapyd-1",
                                      "METEORSEED_IDLE_CLOSE": 0})
    wait_for(lambda: len(stored_docs(store)) >= 16, 120)
    wait_for(lambda: slow_news.active >= 2, 30, 0.01)
    in_flight = slow_news.active
    cancel = [("project", PROJECT), ("job", first)] + ([("signal", signal)] if signal else [])
    assert scrapyd.post("cancel.json", cancel)["prevstate"] == "running"
    cancelled_at = time.monotonic()
    wait_for(lambda: scrapyd.job_state(first) == "finished", 90, 0.2)
    stop_s = time.monotonic() - cancelled_at

    log = scrapyd.job_log("demo", first)
    assert "Closing spider (shutdown)" in log, log[-3000:]
    assert "unfinished task(s) back to the stream" in log, log[-3000:]
    # An ERROR-level line, not the word: the periodic stats log lists log_count/ERROR.
    assert "Traceback" not in log and "] ERROR: " not in log, log[-5000:]
    stats = _stats(log)
    # Every task the first job started (those in flight at the cancel included) was acked...
    assert stats["meteorseed/started"] == stats["meteorseed/acked"] >= 16 + in_flight
    # ...and what it had read but not started is still pending, handed back for anyone to take.
    left = _pending(sync_redis, keys, "scrapyd-1")
    assert left, "the worker reads ahead: some tasks were buffered, not started, at the cancel"
    assert all(p["time_since_delivered"] >= HANDED_BACK_IDLE_MS for p in left), left
    assert sync_redis.xlen(keys.stream) == ARTICLES - stats["meteorseed/acked"]  # XDEL on ack

    print(f"in flight at the cancel: {in_flight}; acked: {stats['meteorseed/acked']}; "
          f"handed back: {len(left)}; cancel to finished: {stop_s:.1f}s")
    second = scrapyd.schedule("demo", {**common, "METEORSEED_CONSUMER": "scrapyd-2",
                                       "METEORSEED_IDLE_CLOSE": 2})
    wait_for(lambda: scrapyd.job_state(second) == "finished", 240, 0.5)
    log2 = scrapyd.job_log("demo", second)
    assert "Closing spider (finished)" in log2, log2[-3000:]

    docs = stored_docs(store)
    assert sorted(d["url"] for d in docs.values()) == sorted(urls)
    assert set(docs) == {f"demo_news:article-{i}" for i in range(1, ARTICLES + 1)}
    # Exactly once: no article was fetched twice, across the cancel and the hand-back.
    assert all(slow_news.hits(f"/news/article/{i}") == 1 for i in range(1, ARTICLES + 1))
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 0
    assert sync_redis.xlen(keys.stream) == 0
    assert sync_redis.xlen(keys.dead) == 0
    assert _stats(log2)["meteorseed/reclaimed"] >= len(left)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SCRAPY_SETTINGS_MODULE", None)  # the project's scrapy.cfg decides
    return env

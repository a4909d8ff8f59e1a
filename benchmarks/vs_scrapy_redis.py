"""MeteorSeed vs scrapy-redis 0.9.1, side by side: the same spider on the same local site.

Each contender crawls H hub pages, each yielding D detail requests (one item each), with two
``scrapy crawl`` workers against one Redis:

* throughput: both workers run to the end; pages/s from start to the last item stored;
* kill: with slower detail pages, worker 1 gets SIGKILL once a third of the items are in, a
  fresh worker starts, and once the workers are idle we count the detail pages that never got
  an item (lost) and, for scrapy-redis, how many of those its dupefilter now blocks (their
  fingerprints are in ``hub_redis:dupefilter``: re-seeding them would be filtered out).

MeteorSeed gets its hubs as tasks (TaskWriter); scrapy-redis as start URLs of its RedisSpider,
with its Scheduler, RFPDupeFilter and RedisPipeline. ``python benchmarks/vs_scrapy_redis.py``;
the last line is the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from scrapy import Request
from scrapy_redis.dupefilter import RFPDupeFilter

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROJECT = HERE / "vs_project"
sys.path[:0] = [str(REPO), str(PROJECT)]

from vs.spiders.hub import detail_urls  # noqa: E402

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter  # noqa: E402
from meteorseed_scrapy.queue.keys import KeyLayout  # noqa: E402
from meteorseed_scrapy.task.exec_task import ExecTask  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer, free_port  # noqa: E402

CONTENDERS = ("meteorseed", "scrapy-redis")


def hub_urls(site: str, hubs: int, details: int, delay: int, tag: str) -> list[str]:
    return [f"{site}/links/1?hub={tag}{h}&details={details}&delay={delay}" for h in range(hubs)]


class Run:
    """One contender's crawl: its Redis keys, its workers, its item count."""

    def __init__(self, contender: str, redis_url: str, workdir: Path, tag: str) -> None:
        self.contender, self.redis_url, self.workdir, self.tag = contender, redis_url, workdir, tag
        self.redis = redis.Redis.from_url(redis_url, decode_responses=True)
        self.store = workdir / f"{tag}.db"
        self.workers: list[subprocess.Popen[bytes]] = []

    def seed(self, hubs: list[str]) -> None:
        if self.contender == "scrapy-redis":
            self.redis.rpush("hub_redis:start_urls", *hubs)
            return
        tasks = [ExecTask.create(seed_id="vs", site_id="hub", url=u) for u in hubs]

        async def add() -> None:
            client = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
            try:
                await TaskWriter(client, KeyLayout(self.tag)).add(tasks)
            finally:
                await client.aclose()

        asyncio.run(add())

    def start_worker(self, name: str) -> None:
        if self.contender == "scrapy-redis":
            spider, module = "hub_redis", "vs.settings_scrapy_redis"
            settings: dict[str, Any] = {"REDIS_URL": self.redis_url,
                                        "MAX_IDLE_TIME_BEFORE_CLOSE": 3}
        else:
            spider, module = "hub", "vs.settings_meteorseed"
            settings = {
                "METEORSEED_REDIS_URL": self.redis_url, "METEORSEED_NAMESPACE": self.tag,
                "METEORSEED_STORE_URI": f"sqlite:///{self.store}", "METEORSEED_CONSUMER": name,
                "METEORSEED_IDLE_CLOSE": 3, "METEORSEED_CLAIM_IDLE": 2,
                # One local site: lift the per-site politeness limits for both contenders alike.
                "METEORSEED_SITE_RATE": 1_000_000, "METEORSEED_SITE_BURST": 1_000_000,
                "METEORSEED_SITE_CONCURRENCY": 1000,
            }
        settings["LOG_FILE"] = str(self.workdir / f"{self.tag}-{name}.log")
        args = [sys.executable, "-m", "scrapy.cmdline", "crawl", spider]
        for key, value in settings.items():
            args += ["-s", f"{key}={value}"]
        env = dict(os.environ, SCRAPY_SETTINGS_MODULE=module,
                   PYTHONPATH=os.pathsep.join([str(REPO), str(PROJECT)]))
        env.pop("REDIS_URL", None)
        self.workers.append(subprocess.Popen(args, cwd=PROJECT, env=env,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def items(self) -> set[str]:
        if self.contender == "scrapy-redis":
            return {json.loads(raw)["unique_key"] for raw in self.redis.lrange("hub_redis:items",
                                                                              0, -1)}
        if not self.store.exists():
            return set()
        try:
            with sqlite3.connect(self.store) as conn:
                rows = conn.execute("SELECT doc FROM items").fetchall()
        except sqlite3.OperationalError:  # table not created yet
            return set()
        return {json.loads(doc)["unique_key"] for (doc,) in rows}

    def wait_items(self, count: int, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.items()) >= count:
                return time.monotonic()
            time.sleep(0.05)
        raise RuntimeError(f"{self.contender}: fewer than {count} items after {timeout:.0f}s")

    def wait_workers(self, timeout: float) -> None:
        for proc in self.workers:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{self.contender}: a worker did not go idle") from None

    def blocked(self, keys: set[str], by_key: dict[str, str]) -> int:
        if self.contender != "scrapy-redis":
            return 0
        dupefilter = RFPDupeFilter(self.redis, "hub_redis:dupefilter")
        return sum(bool(self.redis.sismember("hub_redis:dupefilter",
                                             dupefilter.request_fingerprint(Request(by_key[k]))))
                   for k in keys)

    def close(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.redis.flushdb()
        self.redis.close()


def expected(hubs: list[str]) -> dict[str, str]:
    out = {}
    for hub in hubs:
        for url in detail_urls(hub):
            query = dict(p.split("=") for p in url.split("?", 1)[1].split("&"))
            out[f"{query['hub']}-{query['i']}"] = url
    return out


def throughput(contender: str, redis_url: str, site: str, workdir: Path, hubs: int,
               details: int, rnd: int) -> float:
    tag = f"tp{rnd}{contender[:2]}"
    run = Run(contender, redis_url, workdir, tag)
    try:
        urls = hub_urls(site, hubs, details, 0, tag)
        run.seed(urls)
        started = time.monotonic()
        run.start_worker("w1")
        run.start_worker("w2")
        done = run.wait_items(hubs * details, timeout=600)
        run.wait_workers(120)
        # Pages fetched: hubs + details. Start-up of the workers is included for both.
        return (hubs + hubs * details) / (done - started)
    finally:
        run.close()


def kill_test(contender: str, redis_url: str, site: str, workdir: Path, hubs: int,
              details: int, delay: int) -> tuple[int, int, int]:
    tag = f"kill{contender[:2]}"
    run = Run(contender, redis_url, workdir, tag)
    try:
        urls = hub_urls(site, hubs, details, delay, tag)
        want = expected(urls)
        run.seed(urls)
        run.start_worker("w1")
        run.start_worker("w2")
        run.wait_items(len(want) // 3, timeout=600)
        run.workers[0].send_signal(signal.SIGKILL)
        run.workers[0].wait()
        run.start_worker("w3")
        run.wait_workers(600)
        lost = set(want) - run.items()
        return len(want), len(lost), run.blocked(lost, want)
    finally:
        run.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hubs", type=int, default=40)
    parser.add_argument("--details", type=int, default=25, help="detail pages per hub")
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds per contender")
    parser.add_argument("--kill-delay", type=int, default=100,
                        help="ms per detail page in the kill test (keeps requests in flight)")
    opts = parser.parse_args()
    port = free_port()
    site_proc = subprocess.Popen(
        [sys.executable, "-m", "meteorseed_scrapy.testing.sites", "--port", str(port)],
        env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    site = f"http://127.0.0.1:{port}"
    try:
        with RedisServer(appendonly=True) as server, \
                tempfile.TemporaryDirectory(prefix="vs-") as tmp:
            workdir = Path(tmp)
            time.sleep(1)  # the site process binds its port
            rates: dict[str, list[float]] = {c: [] for c in CONTENDERS}
            for rnd in range(opts.rounds):
                for contender in CONTENDERS:
                    rate = throughput(contender, server.url, site, workdir, opts.hubs,
                                      opts.details, rnd)
                    rates[contender].append(rate)
                    print(f"throughput round {rnd + 1} {contender}: {rate:.0f} pages/s "
                          "(2 workers)", flush=True)
            kills = {}
            for contender in CONTENDERS:
                total, lost, blocked = kill_test(contender, server.url, site, workdir,
                                                 opts.hubs, opts.details, opts.kill_delay)
                kills[contender] = (total, lost, blocked)
                print(f"kill test {contender}: {lost} of {total} detail pages never got an "
                      f"item; {blocked} of them blocked by the dupefilter", flush=True)
    finally:
        site_proc.terminate()
        site_proc.wait()
    best = {c: max(r) for c, r in rates.items()}
    ms, sr = kills["meteorseed"], kills["scrapy-redis"]
    print(f"killed mid-crawl: meteorseed lost {ms[1]} of {ms[0]}; scrapy-redis lost {sr[1]} of "
          f"{sr[0]} ({sr[2]} blocked by its dupefilter); throughput ratio meteorseed/scrapy-redis "
          f"{best['meteorseed'] / best['scrapy-redis']:.2f}")


if __name__ == "__main__":
    main()

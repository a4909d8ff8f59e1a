"""A fleet of workers crawling two seeds of one loopback site while an operator pauses or
cancels one of them: what reached the site, and when (the pause figure of issue 24.4, shared by
tests/test_seed_control_fleet.py and benchmarks/seed_pause.py)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis

from meteorseed_scrapy.queue.fleet.crawl_progress import read_progress_sync
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.demo_pages import Reply
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.cli_helpers import cli
from tests.e2e_helpers import Worker, enqueue, start_worker, stored_docs

#: What the product promises: no request of a held (or cancelled) seed reaches its site later
#: than this after the hold exists (each worker reads the holds every 0.25 s; the rest is a
#: started request's way to the site on a loaded machine).
BOUND_S = 2.0


class SeedTimedSite(DemoSite):
    """The demo site, noting when each request of each seed (its ``s`` parameter) arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[tuple[float, str]] = []
        self._arrivals_lock = threading.Lock()

    def handle(self, target: str) -> Reply:
        seed = parse_qs(urlsplit(target).query).get("s", [""])[0]
        with self._arrivals_lock:
            self.arrivals.append((time.monotonic(), seed))
        return super().handle(target)

    def of(self, seed: str, after: float) -> list[float]:
        with self._arrivals_lock:
            return [t - after for t, s in self.arrivals if s == seed and t > after]


@dataclass
class Round:
    """One round's facts, times in seconds from the operator's command (``command_s``: how
    long the command took; the hold or mark exists by its end)."""

    command_s: float
    last_request_s: float  # the last request of the seed at the site (0: none after the command)
    after_bound: int  # its requests later than BOUND_S after the command returned
    requests_after: int  # its requests after the command
    other_while: int  # requests of the other seed meanwhile
    stored: int
    total: int
    progress: dict[str, Any] | None


@contextmanager
def fleet(tmp_path: Path, redis_url: str, namespace: str, per_seed: int, workers: int
          ) -> Iterator[tuple[SeedTimedSite, list[str], Path]]:
    """The site, both seeds' tasks enqueued (alternately), ``workers`` workers of 8 requests
    each; yields once 20 items are stored."""
    with SeedTimedSite() as site:
        ids: list[str] = []
        for start in range(0, per_seed, 10):
            for seed in ("target", "other"):
                ids += [t.task_id for t in enqueue(redis_url, namespace, [
                    f"{site.url}/slow/300?s={seed}&i={i}"
                    for i in range(start, min(per_seed, start + 10))], seed_id=seed)]
        store = tmp_path / "items.db"
        running: list[Worker] = [
            start_worker(tmp_path, redis_url, namespace, name=f"w{i}", store=store,
                         CONCURRENT_REQUESTS=8, METEORSEED_IDLE_CLOSE=0)
            for i in range(workers)]
        try:
            wait_for(lambda: len(stored_docs(store)) >= 20, 120)
            yield site, ids, store
        finally:
            for w in running:
                w.signal(signal.SIGTERM)
            for w in running:
                w.wait(60)


def _round(site: SeedTimedSite, t0: float, t1: float, store: Path, total: int,
           progress: dict[str, Any] | None) -> Round:
    after = site.of("target", t0)
    return Round(command_s=t1 - t0, last_request_s=max(after, default=0.0),
                 after_bound=len(site.of("target", t1 + BOUND_S)), requests_after=len(after),
                 other_while=len(site.of("other", t1)), stored=len(stored_docs(store)),
                 total=total, progress=progress)


def pause_round(tmp_path: Path, redis_url: str, namespace: str, *, per_seed: int = 150,
                workers: int = 4) -> Round:
    """Pause seed ``target`` while both crawl; once nothing of it is left to start, resume it
    and wait for every task of both to be stored."""
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = KeyLayout(namespace)
    with fleet(tmp_path, redis_url, namespace, per_seed, workers) as (site, ids, store):
        t0 = time.monotonic()
        code, _, err = cli(redis_url, namespace, "seeds", "pause", "target", "--by", "rig")
        t1 = time.monotonic()
        assert code == 0, err

        def nothing_to_start() -> bool:  # every task waits parked or is stored
            return (sync.xlen(keys.stream) == 0
                    and sync.zcard(keys.delayed) + len(stored_docs(store)) == len(ids))

        wait_for(nothing_to_start, 180)
        held = _round(site, t0, t1, store, len(ids), None)
        code, _, err = cli(redis_url, namespace, "seeds", "resume", "target", "--by", "rig")
        assert code == 0, err
        wait_for(lambda: len(stored_docs(store)) == len(ids), 180)
    docs = stored_docs(store)
    assert {d["task_id"] for d in docs.values()} == set(ids)  # nothing lost
    return held


def cancel_round(tmp_path: Path, redis_url: str, namespace: str, *, per_seed: int = 150,
                 workers: int = 4) -> Round:
    """Cancel seed ``target`` while both crawl; wait for it to be finished and for every task
    of the other to be stored."""
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = KeyLayout(namespace)
    with fleet(tmp_path, redis_url, namespace, per_seed, workers) as (site, ids, store):
        t0 = time.monotonic()
        code, out, err = cli(redis_url, namespace, "seeds", "cancel", "target", "--by", "rig",
                             "--json")
        t1 = time.monotonic()
        assert code == 0, err
        json.loads(out)

        def progress() -> dict[str, Any] | None:
            return read_progress_sync(sync, keys, ["target"])["target"]

        wait_for(lambda: (progress() or {}).get("state") == "finished", 180)
        wait_for(lambda: sum(d["seed_id"] == "other" for d in stored_docs(store).values())
                 == per_seed, 180)
        return _round(site, t0, t1, store, len(ids), progress())

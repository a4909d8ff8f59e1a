"""SIGTERM to a worker whose SQLite store another process holds locked (issue 22: it took
118 s to exit): the worker exits within its shutdown bound, its tasks not acked and not lost
(pending for the next worker), with one line saying why. The store stops waiting for the lock,
the store stage stops retrying; end to end with a real `scrapy crawl` worker, a real Redis, a
real SQLite file locked by a write transaction this test holds open."""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import StoreConfig
from meteorseed_scrapy.store.base import StoreUnavailable
from meteorseed_scrapy.store.group_commit import GroupCommitter
from meteorseed_scrapy.store.sqlite import SQLiteStore
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import enqueue, start_worker
from tests.test_group_commit import FakeStore, Stats, doc


def held_lock(path: Path) -> sqlite3.Connection:
    """Another process's long write transaction on ``path``."""
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("PRAGMA journal_mode=WAL")
    lock.execute("CREATE TABLE IF NOT EXISTS held (x)")
    lock.execute("BEGIN IMMEDIATE")
    lock.execute("INSERT INTO held VALUES (1)")
    return lock


def test_a_write_waiting_for_a_lock_held_elsewhere_fails_once_told_to_stop_waiting(
        tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "items.db"))
    store.namespace = "ns"
    store.upsert_many([doc("first")])
    lock = held_lock(tmp_path / "items.db")
    outcome: list[BaseException] = []

    def write() -> None:
        try:
            store.upsert_many([doc("second")])
        except StoreUnavailable as exc:
            outcome.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    store.stop_waiting()
    writer.join(60)  # (without the call: 20 s of lock waits, then "after N attempts")
    lock.execute("ROLLBACK")
    lock.close()
    assert [str(e).split("; ")[-1] for e in outcome] == [
        "not waiting for it: this worker is stopping"]
    store.close()


class Stopping:
    """The store stage's outage handler, once the crawl is being stopped."""

    def __init__(self) -> None:
        self.outages: list[StoreUnavailable] = []

    def __call__(self, exc: StoreUnavailable) -> None:
        self.outages.append(exc)

    def stopping(self) -> bool:
        return True


class Waiting(FakeStore):
    def __init__(self) -> None:
        super().__init__(down=True)
        self.told = threading.Event()

    def stop_waiting(self) -> None:
        self.told.set()


def commit_all(store: FakeStore, handler: Stopping, names: str) -> list[BaseException | None]:
    """Each document's outcome through a group committer of ``store`` (an hour's retry
    window), its crawl's stop told by ``handler``."""
    commits = GroupCommitter(StoreConfig("sqlite:///unused.db", 100, 0.0, 3600), Stats(),
                             lambda _uri: store, handler)

    async def main() -> list[BaseException | None]:
        try:
            return list(await asyncio.gather(*(commits.submit(doc(n)) for n in names)))
        finally:
            await commits.close()

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_a_stopping_crawl_fails_what_waits_on_an_outage_at_once_in_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    store = Waiting()
    handler = Stopping()
    with caplog.at_level(logging.WARNING):
        # (retry_max of an hour: without the stop, this times out)
        errors = commit_all(store, handler, "abc")
    assert [type(e) for e in errors] == [StoreUnavailable] * 3
    assert store.told.is_set() and handler.outages == []  # not an outage stop: a stop
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(
        "Store unavailable while this worker stops: ") and "their tasks stay pending" in lines[0]


class HeldWrite(FakeStore):
    """A write that waits (as SQLite's busy wait does) until told to stop waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def stop_waiting(self) -> None:
        assert self.gate is not None
        self.gate.set()

    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        super().upsert_many(docs)
        raise StoreUnavailable("locked, held by another process; not waiting for it")


class StopsWhileWriting(Stopping):
    def __init__(self, store: FakeStore) -> None:
        super().__init__()
        self.store = store

    def stopping(self) -> bool:
        return self.store.writing.is_set()


def test_a_crawl_that_stops_during_a_write_tells_the_store_to_stop_waiting() -> None:
    """The crawl begins to stop while a write waits in the store thread: the commit loop,
    awaiting that write, still notices within a poll and tells the store."""
    store = HeldWrite()
    handler = StopsWhileWriting(store)
    started = time.monotonic()
    errors = commit_all(store, handler, "ab")
    assert [type(e) for e in errors] == [StoreUnavailable] * 2 and handler.outages == []
    assert time.monotonic() - started < 20  # (not the FakeStore gate's own 30 s timeout)


def test_sigterm_while_another_process_holds_the_store_locked(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, demo_site: DemoSite,
) -> None:
    keys = KeyLayout(namespace)
    store = tmp_path / "items.db"
    lock = held_lock(store)
    try:
        # (a query of this test's own: the demo site is shared by the session's tests)
        pages = [f"/shop/product/{i}?held={namespace}" for i in range(1, 6)]
        enqueue(redis_url, namespace, [demo_site.url + page for page in pages])
        worker = start_worker(tmp_path, redis_url, namespace, store=store,
                              METEORSEED_IDLE_CLOSE=0)
        # Fetched: their items wait for the lock (SQLite's busy wait, in the store thread).
        wait_for(lambda: all(demo_site.hits(page) for page in pages), 60)
        sent = time.monotonic()
        worker.signal(signal.SIGTERM)
        code = worker.wait(120)
        took = time.monotonic() - sent
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    log = worker.log()
    # The bound (docs/robustness.md): a lock slice per batch, then the usual last writes;
    # generous for a loaded machine (before: 107-118 s, the store retrying for 30 s a batch).
    assert code == 0 and took < 30, (code, took, log[-3000:])
    assert log.count("Store unavailable while this worker stops: ") == 1, log[-3000:]
    assert "stopping this worker" not in log  # (not an outage stop: exit code of a SIGTERM)
    assert sync_redis.xlen(keys.stream) == 5  # nothing acked, nothing lost
    assert sync_redis.xlen(keys.dead) == 0

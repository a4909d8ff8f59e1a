"""Store failures classified by what they are (issue 22.3): a full disk, a read-only database,
a deleted or replaced file, a lost connection, refused credentials are outages (nothing charged
to a document, the batch waits, one log line, a stat, then the worker is told); a refused
document fails alone. Real SQLite files; the full disk is a real one (a small tmpfs) where this
process may mount one, else SQLite's own ``max_page_count`` limit."""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pymongo.errors import AutoReconnect, OperationFailure

from meteorseed_scrapy.settings import StoreConfig
from meteorseed_scrapy.store.base import Store, StoreLost, StoreUnavailable
from meteorseed_scrapy.store.documents import build_document
from meteorseed_scrapy.store.group_commit import GroupCommitter
from meteorseed_scrapy.store.mongo import MongoStore
from meteorseed_scrapy.store.sqlite import SQLiteStore


def doc(key: str, size: int = 10, **fields: Any) -> dict[str, Any]:
    return build_document({"text": "y" * size, **fields}, site_id="s", url=f"https://x/{key}",
                          seed_id=None, task_id=None, unique_key=key)


def fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last block; the filler file's path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == 28  # ENOSPC
    finally:
        os.close(fd)
    return filler


@contextmanager
def mounted_tmpfs(directory: Path, size: str = "512k") -> Iterator[Path]:
    """A real small file system (tmpfs) at ``directory``, or a skip where this process may
    not mount one (it needs root; CI runs as root)."""
    directory.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(directory)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode()[:200]}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with mounted_tmpfs(tmp_path / "disk") as disk:
        yield disk


def committer(store: Store, retry_max: float = 0.3
              ) -> tuple[GroupCommitter, dict[str, int], list[StoreUnavailable]]:
    stats: dict[str, int] = {}
    told: list[StoreUnavailable] = []

    class Stats:
        def inc_value(self, key: str, count: int = 1) -> None:
            stats[key] = stats.get(key, 0) + count

    config = StoreConfig("sqlite:///unused.db", 100, 0.0, retry_max)
    commits = GroupCommitter(config, Stats(), lambda _uri: store,  # type: ignore[arg-type]
                             on_outage=told.append)
    return commits, stats, told


def submit_all(commits: GroupCommitter, docs: list[dict[str, Any]]
               ) -> list[BaseException | None]:
    async def main() -> list[BaseException | None]:
        try:
            return list(await asyncio.gather(*(commits.submit(d) for d in docs)))
        finally:
            await commits.close()

    return asyncio.run(main())


# -- a full disk ---------------------------------------------------------------------------------

def test_a_full_disk_is_an_outage_and_writes_again_once_there_is_room(small_disk: Path) -> None:
    store = SQLiteStore(str(small_disk / "items.db"))
    store.upsert_many([doc("first")])
    filler = fill(small_disk)
    with pytest.raises(StoreUnavailable, match="database or disk is full"):
        store.upsert_many([doc(f"k{i}", 3000) for i in range(20)])
    filler.unlink()
    store.upsert_many([doc("after")])
    assert store.count() == 2
    store.close()


def test_on_a_full_disk_no_document_is_blamed_and_the_worker_is_told_once(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStore(str(small_disk / "items.db"))
    store.upsert_many([doc("first")])
    fill(small_disk)
    commits, stats, told = committer(store)
    with caplog.at_level(logging.DEBUG, logger="meteorseed_scrapy.store.group_commit"):
        outcomes = submit_all(commits, [doc(f"k{i}", 3000) for i in range(30)])
    assert all(isinstance(o, StoreUnavailable) for o in outcomes), outcomes
    assert "one by one" not in caplog.text and "refused document" not in caplog.text
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([r for r in warnings if r.levelno == logging.WARNING]) == 1, caplog.text
    assert [type(t) for t in told] == [StoreUnavailable]
    assert stats["meteorseed/store/outages"] == 1
    assert stats["meteorseed/store/failed"] == 30
    assert "meteorseed/store/committed" not in stats


class Capped(SQLiteStore):
    """A real SQLite store whose file may not grow past its size when ``full`` (SQLite's
    max_page_count, set on every connection it opens)."""

    full = False

    def _connect(self) -> sqlite3.Connection:
        conn = super()._connect()
        if self.full:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")
        return conn


def test_sqlite_own_size_limit_is_the_same_outage(tmp_path: Path) -> None:
    """Where no file system can be filled: SQLite's max_page_count raises the same
    SQLITE_FULL ("database or disk is full")."""
    store = Capped(str(tmp_path / "items.db"))
    store.upsert_many([doc("first")])
    store.close()
    store.full = True
    commits, _, told = committer(store)
    outcomes = submit_all(commits, [doc(f"k{i}", 5000) for i in range(5)])
    assert all(isinstance(o, StoreUnavailable) and "full" in str(o) for o in outcomes), outcomes
    assert len(told) == 1


# -- read-only, deleted, replaced -------------------------------------------------------------

def test_a_read_only_database_is_an_outage(tmp_path: Path) -> None:
    # (chmod does not stop root, and a file system with files open for writing cannot be
    # remounted read-only: SQLite's query_only raises the same SQLITE_READONLY)
    store = SQLiteStore(str(tmp_path / "items.db"))
    store.upsert_many([doc("first")])
    assert store._conn is not None
    store._conn.execute("PRAGMA query_only = 1")
    with pytest.raises(StoreUnavailable, match="readonly"):
        store.upsert_many([doc("second")])
    store.close()


@pytest.mark.parametrize("companions", [("",), ("", "-wal", "-shm")])
def test_a_deleted_file_is_a_lost_store_and_no_new_file_appears(
    tmp_path: Path, companions: tuple[str, ...]
) -> None:
    path = tmp_path / "items.db"
    store = SQLiteStore(str(path))
    store.upsert_many([doc("first")])
    for suffix in companions:
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    for _ in range(2):  # the write into the unlinked file, then the next attempt
        with pytest.raises(StoreLost, match="deleted"):
            store.upsert_many([doc("second")])
    assert not path.exists()
    store.close()


def test_a_write_left_to_confirm_into_a_deleted_file_is_lost_and_no_new_file_appears(
        tmp_path: Path) -> None:
    """The group committer's way: the write in the store thread, the file's check after it,
    elsewhere. The check fails, and the next write goes into no file at all."""
    path = tmp_path / "items.db"
    store = SQLiteStore(str(path))
    store.upsert_unconfirmed([doc("first")])
    store.confirm_written()
    path.unlink()
    store.upsert_unconfirmed([doc("second")])  # (into the unlinked file: not committed)
    with pytest.raises(StoreLost, match="deleted"):
        store.confirm_written()
    with pytest.raises(StoreLost, match="deleted"):
        store.upsert_unconfirmed([doc("third")])
    assert not path.exists()
    store.close()


def test_a_replaced_file_is_a_lost_store(tmp_path: Path) -> None:
    path = tmp_path / "items.db"
    store = SQLiteStore(str(path))
    store.upsert_many([doc("first")])
    other = tmp_path / "restored.db"
    sqlite3.connect(other).close()
    os.replace(other, path)
    with pytest.raises(StoreLost, match="replaced"):
        store.upsert_many([doc("second")])
    store.close()


def test_a_lost_store_gives_up_at_once_without_retrying(tmp_path: Path) -> None:
    path = tmp_path / "items.db"
    store = SQLiteStore(str(path))
    store.upsert_many([doc("first")])
    path.unlink()
    commits, stats, told = committer(store, retry_max=3600)  # no waiting out a lost store
    outcomes = submit_all(commits, [doc("a"), doc("b")])
    assert all(isinstance(o, StoreLost) for o in outcomes)
    assert [type(t) for t in told] == [StoreLost]
    assert "meteorseed/store/retries" not in stats


# -- a refused document, and an outage while looking for it -----------------------------------

def test_a_document_sqlite_cannot_take_fails_alone_on_a_real_file(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "items.db"))
    commits, _, told = committer(store)
    bad = doc("bad", lone="\ud800")  # a lone surrogate cannot be encoded for SQLite
    outcomes = submit_all(commits, [doc("a"), bad, doc("c")])
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], UnicodeEncodeError)
    assert told == [] and store.count() == 2


class FillsUp(Capped):
    """A real SQLite store whose disk fills (SQLITE_FULL) right after ``room`` single writes;
    refuses documents marked ``bad``."""

    def __init__(self, path: Path, room: int) -> None:
        super().__init__(str(path))
        self.room = room

    def _fill(self, docs: list[dict[str, Any]]) -> None:
        if any(d.get("bad") for d in docs):
            raise ValueError("refused (test)")
        if len(docs) == 1:
            if self.room == 0:
                self.close()
                self.full = True
            self.room -= 1

    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        self._fill(docs)
        super().upsert_many(docs)

    def upsert_unconfirmed(self, docs: list[dict[str, Any]]) -> None:  # (the committer's)
        self._fill(docs)
        super().upsert_unconfirmed(docs)


def test_an_outage_while_finding_the_culprit_blames_no_one_after_it(tmp_path: Path) -> None:
    store = FillsUp(tmp_path / "items.db", room=1)
    SQLiteStore(str(tmp_path / "items.db")).upsert_many([doc("first")])
    commits, stats, told = committer(store)
    docs = [doc("a"), doc("b", bad=True)] + [doc(f"big{i}", 20000) for i in range(3)]
    outcomes = submit_all(commits, docs)
    assert outcomes[0] is None
    assert isinstance(outcomes[1], ValueError)  # the culprit, alone
    assert all(isinstance(o, StoreUnavailable) for o in outcomes[2:]), outcomes
    assert len(told) == 1 and stats["meteorseed/store/outages"] == 1


# -- MongoDB: lost connection, refused credentials, a full disk --------------------------------

class FailingCollection:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.name = "items"

    def create_index(self, *args: Any, **kwargs: Any) -> None:
        pass

    def index_information(self) -> dict[str, Any]:
        return {}

    def bulk_write(self, operations: list[Any], ordered: bool) -> None:
        raise self.exc

    def find_one_and_update(self, *args: Any, **kwargs: Any) -> None:  # (the change sequence)
        raise self.exc


class FailingDatabase(dict):  # type: ignore[type-arg]
    def __missing__(self, name: str) -> FailingCollection:
        return self["failing"]

    def list_collection_names(self) -> list[str]:
        return []


def mongo_failing_with(exc: Exception) -> MongoStore:
    client = {"meteorseed": FailingDatabase(failing=FailingCollection(exc))}
    return MongoStore(client, owns_client=False)


@pytest.mark.parametrize("exc", [
    AutoReconnect("connection reset"),
    OperationFailure("Authentication failed.", code=18),
    OperationFailure("not authorized on meteorseed to execute command", code=13),
    OperationFailure("Out of disk space", code=14031),
], ids=["lost connection", "authentication", "unauthorized", "disk full"])
def test_mongodb_store_failures_are_outages(exc: Exception) -> None:
    with pytest.raises(StoreUnavailable):
        mongo_failing_with(exc).upsert_many([doc("a")])


def test_mongodb_refusing_a_document_is_the_document_s() -> None:
    with pytest.raises(OperationFailure):
        mongo_failing_with(OperationFailure("bad value", code=2)).upsert_many([doc("a")])

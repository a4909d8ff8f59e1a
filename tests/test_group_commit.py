"""GroupCommitter: batches, order, the store's one thread, outages, refused documents, close.

The store is a test double (the back ends have their own tests); everything else is real.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.settings import StoreConfig
from meteorseed_scrapy.store.base import Store, StoreUnavailable
from meteorseed_scrapy.store.group_commit import GroupCommitter


class Stats:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def inc_value(self, key: str, count: int = 1) -> None:
        self.values[key] = self.values.get(key, 0) + count


class FakeStore(Store):
    """Records every write; refuses batches holding a ``bad`` document; may be down for the
    next ``outages`` writes, or for good; may hold a write until ``gate`` is set."""

    def __init__(self, outages: int = 0, down: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()
        self.outages = outages
        self.down = down
        self.gate: threading.Event | None = None
        self.writing = threading.Event()
        self.closed = False

    def upsert_many(self, docs: list[dict[str, Any]]) -> None:
        self.threads.add(threading.current_thread().name)
        self.writing.set()
        if self.gate is not None:
            self.gate.wait(30)
        if self.down or self.outages > 0:
            self.outages -= 1
            raise StoreUnavailable("connection refused")
        if any(doc.get("bad") for doc in docs):
            raise ValueError(f"document too large: {[d['_id'] for d in docs if d.get('bad')]}")
        self.batches.append([doc["_id"] for doc in docs])

    def get(self, doc_id: str) -> dict[str, Any] | None:
        return None

    def count(self) -> int:
        return sum(len(b) for b in self.batches)

    def iter_docs(self) -> Iterator[dict[str, Any]]:
        return iter(())

    def close(self) -> None:
        self.closed = True


def committer(store: FakeStore, batch_size: int = 100, batch_wait: float = 0.0,
              retry_max: float = 30.0) -> tuple[GroupCommitter, Stats]:
    stats = Stats()
    config = StoreConfig("sqlite:///unused.db", batch_size, batch_wait, retry_max)
    return GroupCommitter(config, stats, lambda _uri: store), stats  # type: ignore[arg-type]


def doc(name: str, bad: bool = False) -> dict[str, Any]:
    return {"_id": f"s:{name}", "bad": bad}


async def until_writing(store: FakeStore) -> None:
    """The store thread is inside a write (held by its gate)."""
    await asyncio.get_running_loop().run_in_executor(None, store.writing.wait, 30)


async def one_then_close(commits: GroupCommitter) -> BaseException | None:
    """Submit one document, then close: its outcome."""
    try:
        return await commits.submit(doc("a"))
    finally:
        await commits.close()


async def behind_a_held_write(commits: GroupCommitter, store: FakeStore,
                              names: list[str]) -> list[BaseException | None]:
    """Submit the first document; the rest while its write is held (``store.gate``); then
    release it and close: every outcome, in order."""
    first = asyncio.ensure_future(commits.submit(doc(names[0])))
    await until_writing(store)
    rest = [asyncio.ensure_future(commits.submit(doc(n))) for n in names[1:]]
    await asyncio.sleep(0)  # (let them join their batches)
    assert store.gate is not None
    store.gate.set()
    try:
        return list(await asyncio.gather(first, *rest))
    finally:
        await commits.close()


def test_an_idle_store_writes_at_once_in_its_own_thread() -> None:
    store = FakeStore()
    commits, stats = committer(store)

    assert asyncio.run(one_then_close(commits)) is None
    assert store.batches == [["s:a"]]
    assert store.closed
    assert len(store.threads) == 1 and next(iter(store.threads)).startswith("meteorseed-store")
    assert stats.values == {"meteorseed/store/batches": 1, "meteorseed/store/committed": 1}


def test_items_arriving_during_a_write_go_together_in_order_within_the_batch_size() -> None:
    store = FakeStore()
    store.gate = threading.Event()
    commits, _ = committer(store, batch_size=2)

    assert asyncio.run(behind_a_held_write(commits, store, list("abcdef"))) == [None] * 6
    assert store.batches == [["s:a"], ["s:b", "s:c"], ["s:d", "s:e"], ["s:f"]]


def test_batch_wait_gathers_what_comes_together_into_one_write() -> None:
    store = FakeStore()
    commits, _ = committer(store, batch_wait=0.05)

    async def main() -> None:
        try:
            await asyncio.gather(*(commits.submit(doc(n)) for n in "abc"))
        finally:
            await commits.close()

    asyncio.run(main())
    assert store.batches == [["s:a", "s:b", "s:c"]]


def test_a_refused_document_fails_alone() -> None:
    store = FakeStore()
    commits, stats = committer(store, batch_wait=0.05)

    async def main() -> list[BaseException | None]:
        try:
            return list(await asyncio.gather(
                commits.submit(doc("a")), commits.submit(doc("b", bad=True)),
                commits.submit(doc("c"))))
        finally:
            await commits.close()

    a, b, c = asyncio.run(main())
    assert a is None and c is None
    assert isinstance(b, ValueError) and "s:b" in str(b)
    assert store.batches == [["s:a"], ["s:c"]]  # written one by one to find the culprit
    assert stats.values["meteorseed/store/failed"] == 1
    assert stats.values["meteorseed/store/committed"] == 2


def test_an_outage_is_retried_until_the_store_is_back() -> None:
    store = FakeStore(outages=2)
    commits, stats = committer(store)

    assert asyncio.run(one_then_close(commits)) is None
    assert store.batches == [["s:a"]]
    assert stats.values["meteorseed/store/retries"] == 2
    assert "meteorseed/store/failed" not in stats.values


def test_a_long_outage_fails_every_waiting_item_with_the_outage() -> None:
    store = FakeStore(down=True)
    commits, stats = committer(store, retry_max=0.3)

    async def main() -> list[BaseException | None]:
        try:
            return list(await asyncio.gather(*(commits.submit(doc(n)) for n in "ab")))
        finally:
            await commits.close()

    outcomes = asyncio.run(main())
    assert all(isinstance(o, StoreUnavailable) for o in outcomes)
    assert store.batches == []
    assert stats.values["meteorseed/store/failed"] == 2


def test_one_cancelled_item_does_not_cancel_the_write_of_its_batch() -> None:
    store = FakeStore()
    store.gate = threading.Event()
    commits, _ = committer(store)

    async def main() -> BaseException | None:
        first = asyncio.ensure_future(commits.submit(doc("a")))
        await until_writing(store)
        doomed = asyncio.ensure_future(commits.submit(doc("b")))
        kept = asyncio.ensure_future(commits.submit(doc("c")))
        await asyncio.sleep(0)
        doomed.cancel()
        assert store.gate is not None
        store.gate.set()
        try:
            await first
            return await kept
        finally:
            await commits.close()

    assert asyncio.run(main()) is None
    assert store.batches == [["s:a"], ["s:b", "s:c"]]


def test_close_writes_what_is_still_waiting() -> None:
    store = FakeStore()
    commits, _ = committer(store, batch_wait=3600)  # would wait an hour for more

    async def main() -> None:
        waiting = asyncio.ensure_future(commits.submit(doc("a")))
        await asyncio.sleep(0)
        await commits.close()
        assert await waiting is None

    asyncio.run(main())
    assert store.batches == [["s:a"]] and store.closed


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=25), st.integers(1, 6))
def test_every_item_gets_its_own_outcome_and_good_ones_keep_their_order(
    bad: list[bool], batch_size: int
) -> None:
    store = FakeStore()
    commits, _ = committer(store, batch_size=batch_size)
    docs = [doc(str(i), flag) for i, flag in enumerate(bad)]

    async def main() -> list[BaseException | None]:
        try:
            return list(await asyncio.gather(*(commits.submit(d) for d in docs)))
        finally:
            await commits.close()

    outcomes = asyncio.run(main())
    assert [o is not None for o in outcomes] == bad
    written = [doc_id for batch in store.batches for doc_id in batch]
    assert written == [d["_id"] for d in docs if not d["bad"]]
    assert all(len(batch) <= batch_size for batch in store.batches)


def test_on_commit_runs_for_committed_documents_before_their_submitters_resume() -> None:
    # The store stage acks a task from on_commit: it must run only for a document really
    # committed (not a refused one, not a cancelled submitter's), before the submitter
    # resumes, and one hook's error must not cost its batch-mates theirs.
    store = FakeStore()
    store.gate = threading.Event()
    commits, _ = committer(store)
    heard: list[str] = []

    def hook(name: str) -> Any:
        def run() -> None:
            heard.append(name)
            if name == "d":
                raise RuntimeError("a bug in the hook")
        return run

    async def submit(name: str, bad: bool = False) -> tuple[BaseException | None, list[str]]:
        error = await commits.submit(doc(name, bad), hook(name))
        return error, list(heard)  # what had been heard when this submitter resumed

    async def main() -> list[Any]:
        first = asyncio.ensure_future(submit("a"))
        await until_writing(store)
        rest = [asyncio.ensure_future(submit(n, bad=n == "c")) for n in "bcde"]
        doomed = asyncio.ensure_future(submit("f"))
        await asyncio.sleep(0)
        doomed.cancel()
        assert store.gate is not None
        store.gate.set()
        try:
            return [await first, *[await r for r in rest]]
        finally:
            await commits.close()

    a, b, c, d, e = asyncio.run(main())
    assert a == (None, ["a"])
    assert b[0] is None and d[0] is None and e[0] is None and isinstance(c[0], ValueError)
    assert heard == ["a", "b", "d", "e"]  # not c (refused), not f (cancelled)
    assert "b" in b[1] and "d" in d[1] and "e" in e[1]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 4), st.integers(1, 3), st.integers(2, 9))
def test_an_outage_under_queued_batches_keeps_the_order_of_writes(
    outages: int, batch_size: int, count: int
) -> None:
    # Batches queued behind a failing write must not be written before it is (a later
    # version of a document would be overwritten by an older one).
    store = FakeStore(outages=outages)
    store.gate = threading.Event()
    commits, _ = committer(store, batch_size=batch_size)

    names = [str(i) for i in range(count)]
    assert asyncio.run(behind_a_held_write(commits, store, names)) == [None] * count
    assert [d for batch in store.batches for d in batch] == [f"s:{i}" for i in range(count)]

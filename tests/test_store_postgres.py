"""PostgreSQL store failures against a real server (started here; skipped where PostgreSQL is not
installed): a stopped server, refused credentials and a read-only database are outages that
end when the server is back; a document PostgreSQL cannot take fails alone."""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Iterator
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from meteorseed_scrapy.store.backends import open_store  # noqa: E402
from meteorseed_scrapy.store.base import StoreUnavailable  # noqa: E402
from meteorseed_scrapy.store.documents import build_document  # noqa: E402
from meteorseed_scrapy.store.identity import store_identity  # noqa: E402
from meteorseed_scrapy.store.postgres import PostgresStore, document_error  # noqa: E402
from meteorseed_scrapy.testing.postgres import PostgresServer, running_postgres  # noqa: E402
from tests.store_helpers import all_ids  # noqa: E402
from tests.test_store_outages import committer, submit_all  # noqa: E402


def doc(key: str, **fields: Any) -> dict[str, Any]:
    return build_document({"text": "y", **fields}, site_id="s", url=f"https://x/{key}",
                          seed_id=None, task_id=None, unique_key=key)


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A server of this test's own, to stop and start."""
    with running_postgres() as server:
        yield server


def test_a_stopped_server_is_an_outage_and_the_same_store_writes_once_it_is_back(
        own_server: PostgresServer) -> None:
    store = open_store(own_server.uri())
    store.upsert_many([doc("a")])
    own_server.stop()
    with pytest.raises(StoreUnavailable, match=r"PostgreSQL 127\.0\.0\.1"):
        store.upsert_many([doc("b")])
    with pytest.raises(StoreUnavailable):  # (and not a hang, nor a crash on a dead connection)
        store.upsert_many([doc("b")])
    own_server.start()
    store.upsert_many([doc("b")])
    assert all_ids(store) == {"s:a", "s:b"}
    store.close()


def test_a_server_stopped_under_the_group_committer_blames_no_document(
        own_server: PostgresServer) -> None:
    store = open_store(own_server.uri())
    store.upsert_many([doc("first")])
    own_server.stop()
    commits, stats, told = committer(store, retry_max=0.5)
    outcomes = submit_all(commits, [doc("a"), doc("b")])
    assert all(isinstance(o, StoreUnavailable) for o in outcomes)
    assert len(told) == 1 and stats["meteorseed/store/outages"] == 1
    assert "meteorseed/store/committed" not in stats


def test_refused_credentials_are_an_outage(postgres_server: PostgresServer) -> None:
    uri = postgres_server.uri().replace("postgres@", "nosuchrole@")
    with pytest.raises(StoreUnavailable, match="nosuchrole"):
        open_store(uri).upsert_many([doc("a")])


def test_a_read_only_database_is_an_outage(postgres_server: PostgresServer,
                                           postgres_uri: str) -> None:
    store = open_store(postgres_uri)
    store.upsert_many([doc("a")])
    database = postgres_uri.rsplit("/", 1)[1]
    with psycopg.connect(postgres_server.uri(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    store.close()  # (the setting applies to new sessions)
    with pytest.raises(StoreUnavailable, match="read-only"):
        store.upsert_many([doc("b")])
    with psycopg.connect(postgres_server.uri(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = off')
    store.upsert_many([doc("b")])
    assert store.count() == 2


def test_a_role_that_may_only_read_and_write_the_tables_works(postgres_uri: str) -> None:
    open_store(postgres_uri).count()  # the tables and indexes, made by their owner (a DBA)
    with psycopg.connect(postgres_uri, autocommit=True) as admin:
        role = f"app_{postgres_uri.rsplit('_', 1)[1]}"
        admin.execute(f"CREATE ROLE {role} LOGIN")  # (no CREATE on schema public: PG 15)
        admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON items, anomalies TO {role}")
    with open_store(postgres_uri.replace("postgres@", f"{role}@"), "ns") as store:
        store.upsert_many([doc("a")])
        assert all_ids(store) == {"s:a"}


def test_a_document_postgresql_cannot_take_fails_alone(postgres_uri: str) -> None:
    store = open_store(postgres_uri)
    commits, stats, told = committer(store)
    bad = doc("bad", text="nul \0 inside")  # jsonb cannot hold U+0000
    outcomes = submit_all(commits, [doc("a"), bad, doc("c")])
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], psycopg.errors.UntranslatableCharacter)
    assert told == [] and stats["meteorseed/store/failed"] == 1
    with open_store(postgres_uri) as check:
        assert all_ids(check) == {"s:a", "s:c"}


@pytest.mark.parametrize(("error", "documents"), [
    (psycopg.errors.UntranslatableCharacter, True),
    (psycopg.errors.NumericValueOutOfRange, True),
    (psycopg.errors.CheckViolation, True),
    (psycopg.errors.ProgramLimitExceeded, True),
    (psycopg.errors.DiskFull, False),
    (psycopg.errors.ReadOnlySqlTransaction, False),
    (psycopg.errors.InvalidPassword, False),
    (psycopg.errors.AdminShutdown, False),
    (psycopg.errors.InsufficientPrivilege, False),
    (psycopg.errors.TooManyConnections, False),
    (psycopg.errors.DeadlockDetected, False),
    (psycopg.OperationalError, False),
])
def test_errors_are_classified_by_sqlstate(error: type[Exception], documents: bool) -> None:
    assert document_error(error("x")) is documents


def _writer(uri: str, worker: int, batches: int, barrier: Any) -> None:
    rng = random.Random(worker)
    store = open_store(uri)
    barrier.wait()
    for b in range(batches):
        shared = [doc(f"shared-{i}", worker=worker, batch=b) for i in range(20)]
        rng.shuffle(shared)  # each worker its own order: rows locked in another order
        store.upsert_many([doc(f"w{worker}-{b}-{i}") for i in range(30)] + shared)
    store.close()


def test_concurrent_processes_sharing_documents_lose_nothing(postgres_uri: str) -> None:
    workers, batches = 4, 30
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_writer, args=(postgres_uri, w, batches, barrier))
             for w in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0] * workers  # (a deadlock raises)
    with open_store(postgres_uri) as store:
        assert store.count() == workers * batches * 30 + 20
        shared = store.get("s:shared-0")
        assert shared is not None and shared["batch"] == batches - 1


def test_store_identity_leaves_credentials_and_options_out() -> None:
    assert (store_identity("postgresql://u:secret@DB.example:5433/items?sslmode=require")
            == "postgresql://db.example:5433/items")
    assert isinstance(open_store("postgres://h/db"), PostgresStore)

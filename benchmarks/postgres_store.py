"""The PostgreSQL store: a crawl's pages/s on PostgreSQL ÷ the same crawl on SQLite, and the
store's write throughput against a plain ``executemany`` of the same rows.

    .venv/bin/python benchmarks/postgres_store.py [--rounds 3] [--pages 2000] [--docs 20000]

Both need a PostgreSQL server binary (Debian's postgresql-15): a throwaway server is started
on a free loopback port (``meteorseed_scrapy.testing.postgres``), fsync on, as SQLite's
``synchronous=FULL``.

* crawl: the throughput benchmark's worker (``bench_project``, one item per ~5 KB page,
  CONCURRENT_REQUESTS=16, the add-on's default set-up), timed from its first response to its
  last committed item, once with ``METEORSEED_STORE_URI=sqlite:///…`` and once with
  ``postgresql://…`` per round, in alternating order; the figure is the median of per-round
  ratios. The mean commit batch size (``meteorseed/store/committed`` ÷ ``batches``) is shown.
* store: ``--docs`` documents of ~1 KB written in batches of ``--batch`` (the default
  ``METEORSEED_STORE_BATCH_SIZE``) by ``PostgresStore.upsert_many`` (one ``INSERT … SELECT
  unnest … ON CONFLICT`` per batch) and by a plain ``executemany`` of ``INSERT … ON CONFLICT``
  with one row each into a table of the same shape and indexes, committing per batch; then
  the same documents again (every row a conflict). The SQLite store's rate is shown for reference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _crawl_rig import (
    bench_rig,
    enqueue_tasks,
    log_errors,
    median,
    source_label,
    start_worker,
)

from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.documents import build_document
from meteorseed_scrapy.store.postgres import INDEXES
from meteorseed_scrapy.testing.postgres import PostgresServer

PLAIN = ("INSERT INTO plain (namespace, _id, doc) VALUES (%s, %s, %s::jsonb) ON CONFLICT"
         " (namespace, _id) DO UPDATE SET doc = excluded.doc")


def crawl(store_uri: str, rnd: int, pages: int, urls: list[str], redis_url: str,
          workdir: Path, label: str) -> tuple[float, float]:
    """(pages/s, mean batch size) of one crawl into ``store_uri``."""
    redis.Redis.from_url(redis_url).flushall()
    rundir = workdir / f"r{rnd}-{label}"
    rundir.mkdir()
    namespace = f"bench{rnd}{label}"
    if enqueue_tasks(redis_url, namespace, urls) != pages:
        raise RuntimeError("not every task was enqueued")
    worker = start_worker(rundir, "w", "bench", "bench.settings_meteorseed", {
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_STORE_URI": store_uri, "METEORSEED_CONSUMER": "bench-w1",
        "METEORSEED_IDLE_CLOSE": 1})
    code = worker.wait(900)
    errors = log_errors(worker)
    if code != 0 or errors:
        raise RuntimeError(f"{label} run {rnd} failed (exit {code}): {errors[:5]}\n"
                           + worker.log()[-3000:])
    timing = worker.timing()
    stats = timing["stats"]
    with open_store(store_uri, namespace) as store:
        stored = store.count()
    if stored != pages or int(stats.get("meteorseed/acked", 0)) != pages:
        raise RuntimeError(f"{label} run {rnd}: stored {stored}, acked "
                           f"{stats.get('meteorseed/acked')} of {pages}")
    seconds = timing["last_item"] - timing["first_response"]
    batch = stats["meteorseed/store/committed"] / max(1, stats["meteorseed/store/batches"])
    return pages / seconds, batch


def documents(count: int) -> list[dict[str, Any]]:
    return [build_document({"title": f"Title {i}", "body": "x" * 1000, "n": i}, site_id="bench",
                           url=f"https://bench.example/{i}", seed_id="s", task_id=f"t{i}",
                           unique_key=str(i)) for i in range(count)]


def store_rates(uri: str, sqlite_uri: str, docs: list[dict[str, Any]], batch: int
                ) -> dict[str, float]:
    """Documents per second of each writer, first writes then rewrites."""
    batches = [docs[i:i + batch] for i in range(0, len(docs), batch)]
    rates: dict[str, float] = {}
    for name, target in (("store", uri), ("sqlite store", sqlite_uri)):
        with open_store(target, "bench") as store:
            for phase in ("insert", "upsert"):
                start = time.perf_counter()
                for chunk in batches:
                    store.upsert_many(chunk)
                rates[f"{name} {phase}"] = len(docs) / (time.perf_counter() - start)
    with psycopg.connect(uri) as conn:
        conn.execute("CREATE TABLE plain (namespace text NOT NULL, _id text NOT NULL,"
                     " doc jsonb NOT NULL, PRIMARY KEY (namespace, _id))")
        for name, expressions in INDEXES.items():  # the same indexes as the store's table
            conn.execute(f"CREATE INDEX plain_{name} ON plain (namespace, {expressions})"
                         .encode())
        conn.commit()
        for phase in ("insert", "upsert"):
            start = time.perf_counter()
            for chunk in batches:
                with conn.cursor() as cursor:
                    cursor.executemany(PLAIN, [
                        ("bench", doc["_id"], json.dumps(doc, separators=(",", ":")))
                        for doc in chunk])
                conn.commit()
            rates[f"executemany {phase}"] = len(docs) / (time.perf_counter() - start)
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(argv)
    print(source_label(), flush=True)
    with PostgresServer() as pg, bench_rig(None, "meteorseed-pg-bench-", 0.2) as (
            workdir, server, site):
        docs = documents(args.docs)
        rates = store_rates(pg.create_database("bench_store"),
                            f"sqlite:///{workdir / 'store.db'}", docs, args.batch)
        print(f"store writes, {args.docs} documents of ~1 KB in batches of {args.batch}:")
        for name, rate in rates.items():
            print(f"  {name:<20} {rate:9.0f} docs/s")
        for phase in ("insert", "upsert"):
            print(f"  store ÷ executemany ({phase}): "
                  f"{rates[f'store {phase}'] / rates[f'executemany {phase}']:.2f}")
        urls = [f"{site.url}/item/{i}" for i in range(args.pages)]
        ratios: list[float] = []
        for rnd in range(1, args.rounds + 1):
            results = {}
            order = ["sqlite", "postgres"] if rnd % 2 else ["postgres", "sqlite"]
            for label in order:
                uri = (f"sqlite:///{workdir / f'r{rnd}.db'}" if label == "sqlite"
                       else pg.create_database(f"crawl_{rnd}_{uuid.uuid4().hex[:6]}"))
                results[label] = crawl(uri, rnd, args.pages, urls, server.url, workdir, label)
                print(f"round {rnd} {label:<8} {results[label][0]:7.1f} pages/s, "
                      f"mean commit batch {results[label][1]:.1f} items", flush=True)
            ratios.append(results["postgres"][0] / results["sqlite"][0])
        print(f"crawl pages/s, PostgreSQL ÷ SQLite (median of {args.rounds} rounds, "
              f"{args.pages} pages): {median(ratios):.2f}")


if __name__ == "__main__":
    main()

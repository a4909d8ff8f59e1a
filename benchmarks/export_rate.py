"""``meteorseed export`` rate: documents per second from SQLite and PostgreSQL.

    .venv/bin/python benchmarks/export_rate.py [--docs 50000] [--limit 0]

``--docs`` documents of ~1 KB (the PostgreSQL benchmark's) are written to each store through
its own ``upsert_many`` in batches of 100 (not timed); then ``meteorseed export -o FILE`` (the
CLI's own code, in this process) is timed from the call to its return, JSON Lines to a file
on the local disk, whole or, with ``--limit N``, in runs of N documents resumed each from the
cursor the last printed (the cost of resuming). PostgreSQL is a throwaway server
(``meteorseed_scrapy.testing.postgres``); it is skipped where no server binary is installed.
The last lines are the figures.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from postgres_store import documents

from meteorseed_scrapy.cli import main as meteorseed
from meteorseed_scrapy.store.backends import open_store


def fill(uri: str, count: int) -> None:
    docs = documents(count)
    with open_store(uri) as store:
        for start in range(0, count, 100):
            store.upsert_many(docs[start:start + 100])


def export(uri: str, target: Path, limit: int, expected: int) -> tuple[float, int, int]:
    """Seconds, documents written, runs needed. A run ends short of ``expected`` when a
    transaction was still running on the PostgreSQL server (autovacuum's ANALYZE after the
    fill): the next run, from its cursor, takes the rest."""
    cursor, runs, written = "", 0, 0
    start = time.perf_counter()
    while written < expected and time.perf_counter() - start < 120:
        err = io.StringIO()
        args = ["export", "--store-uri", uri, "-o", str(target)]
        if cursor:
            args += ["--since", cursor]
        if limit:
            args += ["--limit", str(limit)]
        if meteorseed(args, stdout=io.StringIO(), stderr=err) != 0:
            raise SystemExit(err.getvalue())
        runs += 1
        cursor = err.getvalue().splitlines()[-1].removeprefix("cursor=")
        with target.open(encoding="utf-8") as file:
            written = sum(1 for _ in file)
    return time.perf_counter() - start, written, runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--limit", type=int, default=0, help="documents per run (0: one run)")
    parser.add_argument("--mongomock", action="store_true", help="mongomock-ng too")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="meteorseed-export-")))
        uris = {"sqlite": f"sqlite:///{tmp / 'items.db'}"}
        if args.mongomock:  # (in-process and slow: not a MongoDB figure)
            uris["mongomock"] = f"mongomock://{uuid.uuid4().hex}/bench"
        try:
            from meteorseed_scrapy.testing.postgres import PostgresServer

            pg = stack.enter_context(PostgresServer())
            uris["postgresql"] = pg.create_database("export_bench")
        except Exception as exc:  # (no server binary here: the other stores still run)
            print(f"PostgreSQL skipped: {exc}")
        results = {}
        for name, uri in uris.items():
            fill(uri, args.docs)
            seconds, written, runs = export(uri, tmp / f"{name}.jsonl", args.limit, args.docs)
            if written != args.docs:
                raise SystemExit(f"{name}: {written} documents exported of {args.docs}")
            results[name] = (seconds, runs)
        for name, (seconds, runs) in results.items():
            print(f"export {name:<11} {args.docs} docs of ~1 KB in {seconds:6.2f} s "
                  f"({runs} run(s)): {args.docs / seconds:8.0f} docs/s")


if __name__ == "__main__":
    main()

"""Redis commands a worker sends per completed task, counted with MONITOR.

    .venv/bin/python benchmarks/redis_commands_per_task.py [--tasks 500] [--shards 1]

A throwaway Redis and the demo site (``DemoSite``, news articles) on loopback; N tasks are
enqueued with TaskWriter BEFORE monitoring starts (the enqueue phase is not counted). Then a
MONITOR connection is opened and one real worker (``scrapy crawl probe`` of
``tests/e2e_project``: one item per page, stored in SQLite, no link following) runs until it
closes by itself (``METEORSEED_IDLE_CLOSE``). Every top-level command MONITOR shows is the
worker's: the monitor's own connection never appears in its output, and nothing else talks to
this Redis meanwhile. Commands run inside Lua scripts (``[0 lua]`` lines) are excluded: a script
call counts as one command, as the issue asks. Start-up and the idle wait before closing are
included, so the figure slightly overstates the steady state. ``--shards S`` runs the worker
with ``METEORSEED_STREAM_SHARDS=S`` and spreads the tasks over S sites, one per shard.
``--feed ids|documents`` runs the worker with that ``METEORSEED_ITEMS_FEED`` (the items feed's
XADDs are arguments of the ack script calls: compare with ``--feed off``, the default).
The last line is the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter  # noqa: E402
from meteorseed_scrapy.queue.keys import KeyLayout, shard_of  # noqa: E402
from meteorseed_scrapy.task.exec_task import ExecTask  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402
from meteorseed_scrapy.testing.sites import DemoSite  # noqa: E402
from tests.e2e_helpers import start_worker, stored_docs  # noqa: E402

GOAL = 6
NAMESPACE = "bench"
# `+1700000000.123456 [0 127.0.0.1:40000] "XREADGROUP" ...` or `[0 lua] "XACK" ...`
_LINE = re.compile(r'^\+?\d+\.\d+ \[\d+ ([^\]]+)\] "([^"]+)"')


class Monitor:
    """A raw MONITOR connection read by a thread; ``stop()`` returns the lines it saw."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
        self.sock.sendall(b"MONITOR\r\n")
        self.file = self.sock.makefile("rb")
        if self.file.readline().strip() != b"+OK":
            raise RuntimeError("MONITOR was refused")
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for raw in self.file:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
        except (OSError, ValueError):  # the socket was shut down by stop()
            pass

    def stop(self) -> list[str]:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(10)
        self.sock.close()
        return self.lines


def count_commands(lines: list[str]) -> tuple[Counter[str], int]:
    """Top-level commands by name, and how many ran inside Lua scripts (left out)."""
    top: Counter[str] = Counter()
    in_lua = 0
    for line in lines:
        match = _LINE.match(line)
        if not match:
            continue
        if match.group(1) == "lua":
            in_lua += 1
        else:
            top[match.group(2).upper()] += 1
    return top, in_lua


def _enqueue(url: str, keys: KeyLayout, tasks: list[ExecTask]) -> None:
    async def go() -> None:
        client = aioredis.Redis.from_url(url, decode_responses=True)
        try:
            await TaskWriter(client, keys).add(tasks)
        finally:
            await client.aclose()

    asyncio.run(go())


def run(n: int, shards: int = 1, feed: str = "off") -> int:
    keys = KeyLayout(NAMESPACE, shards)
    names: list[str] = []  # one site per shard
    covered: set[int] = set()
    i = 0
    while len(covered) < shards:
        if shard_of(f"bench{i}", shards) not in covered:
            covered.add(shard_of(f"bench{i}", shards))
            names.append(f"bench{i}")
        i += 1
    with tempfile.TemporaryDirectory(prefix="meteorseed-cmds-") as tmp, \
            RedisServer() as server, DemoSite(news_pages=n // 10 + 1) as site:
        workdir = Path(tmp)
        _enqueue(server.url, keys, [
            ExecTask.create(seed_id="s1", site_id=names[i % len(names)],
                            url=f"{site.url}/news/article/{i}") for i in range(1, n + 1)])
        monitor = Monitor(server.url)
        worker = start_worker(
            workdir, server.url, NAMESPACE, name="w1",
            METEORSEED_IDLE_CLOSE=1, METEORSEED_SITE_RATE=10000, METEORSEED_SITE_BURST=1000,
            METEORSEED_SITE_CONCURRENCY=16, CONCURRENT_REQUESTS=16,
            METEORSEED_STREAM_SHARDS=shards, METEORSEED_ITEMS_FEED=feed,
        )
        code = worker.wait(timeout=600)
        lines = monitor.stop()
        if code != 0:
            print(worker.log()[-3000:], file=sys.stderr)
            raise SystemExit(f"worker exited with {code}")
        stored = len(stored_docs(workdir / "items.db"))
        client = redis.Redis.from_url(server.url, decode_responses=True)
        left = sum(int(client.xlen(stream)) for stream in keys.streams)
        dead = int(client.xlen(keys.dead))
        fed = int(client.xlen(keys.items_feed))
        client.close()
    top, in_lua = count_commands(lines)
    total = sum(top.values())
    print(f"tasks enqueued: {n} (sites {', '.join(names)}; {shards} shard(s)); items stored: "
          f"{stored}; left in the streams: {left}; dead: {dead}; items feed ({feed}): {fed}")
    print(f"commands inside Lua scripts (not counted): {in_lua}")
    print("top-level commands sent by the worker, by name:")
    for name, count in top.most_common():
        print(f"  {name:<14}{count:>8}  {count / max(stored, 1):6.2f}/task")
    print(f"  {'total':<14}{total:>8}")
    if stored == 0:
        raise SystemExit("no task completed")
    print(f"redis commands per completed task: {total / stored:.2f} (goal <= {GOAL})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=500, help="tasks to run (default 500)")
    parser.add_argument("--shards", type=int, default=1,
                        help="METEORSEED_STREAM_SHARDS, tasks over one site per shard (default 1)")
    parser.add_argument("--feed", choices=("off", "ids", "documents"), default="off",
                        help="METEORSEED_ITEMS_FEED of the worker (default off)")
    args = parser.parse_args()
    return run(args.tasks, args.shards, args.feed)


if __name__ == "__main__":
    raise SystemExit(main())

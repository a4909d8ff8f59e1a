"""A fleet's throughput with one pathological page among normal ones (issue 22.5).

A site rule's field regex (``--regex``, ``^(a+)+$`` by default) backtracks exponentially
on a run of ``a`` that does not end the text. One page of the crawl has such a title
(``--letters`` of them and a ``!``), the ``--pages`` others are ordinary. ``--workers``
``scrapy crawl sites`` workers (the test project's settings) crawl them all from one Redis;
the figure is the wall time from the first task to the last stored item, and items per
second. Run it against two checkouts to compare:

    .venv/bin/python benchmarks/pathological_page.py --code /path/to/old/checkout
    .venv/bin/python benchmarks/pathological_page.py            # this checkout

With Python's ``re`` (before) the worker holding that page is blocked with the GIL held: its
keep-alive thread cannot renew the heartbeat, the task is taken over by the next worker,
which blocks too. With the rule engine's time bound, the page costs its 0.25 s budget and is
an anomaly.

``--links N``: one page of N links instead (the issue's 1 M), crawled by one ``probe`` worker
(a code spider following every link; the test project's): the figures are the time from the
worker's start to its parent task's ack (its completion record), and the worker's peak RSS
(``VmHWM``) then. ``benchmarks/response_caps.py`` does the same for a gzip bomb and a huge
robots.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter  # noqa: E402
from meteorseed_scrapy.queue.keys import KeyLayout  # noqa: E402
from meteorseed_scrapy.task.exec_task import ExecTask  # noqa: E402
from meteorseed_scrapy.testing.clients import run_with_client  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402

PROJECT = REPO / "tests" / "e2e_project"
RULES = """site_id: bench
version: 1
start: detail
list: {links: "a::attr(href)"}
fields:
  title: {css: "h1::text", regex: '%s'}
  body: "p::text"
"""


Answer = Callable[[str], tuple[bytes, dict[str, str]]]


def serve_pages(answer: Answer) -> http.server.ThreadingHTTPServer:
    """A loopback HTTP server: ``answer(path)`` gives each 200's body and extra headers."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, headers = answer(self.path)
            self.send_response(200)
            for name, value in {"Content-Type": "text/html; charset=utf-8", **headers,
                                "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            with contextlib.suppress(ConnectionError):  # (a capped client hangs up)
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve(letters: int) -> http.server.ThreadingHTTPServer:
    bad = "a" * letters + "!"

    def answer(path: str) -> tuple[bytes, dict[str, str]]:
        title = bad if path == "/bad" else f"page {path}"
        return f"<html><body><h1>{title}</h1><p>text</p></body></html>".encode(), {}

    return serve_pages(answer)


def stored(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM items").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def run(code: Path, pages: int, letters: int, workers: int, timeout: float, regex: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="meteorseed-pathological-"))
    (work / "sites").mkdir()
    (work / "sites" / "bench.yaml").write_text(RULES % regex.replace("'", "''"))
    site = serve(letters)
    base = f"http://127.0.0.1:{site.server_address[1]}"
    urls = [f"{base}/p/{i}" for i in range(pages // 2)] + [f"{base}/bad"] + [
        f"{base}/p/{i}" for i in range(pages // 2, pages)]
    with RedisServer() as redis:
        tasks = [ExecTask.create(seed_id="bench", site_id="bench", url=u,
                                 callback="parse_detail") for u in urls]
        run_with_client(redis.url, lambda c: TaskWriter(c, KeyLayout("bench")).add(tasks))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(PROJECT)]))
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        db = work / "items.db"
        procs = []
        started = time.monotonic()
        for n in range(workers):
            args = [sys.executable, "-m", "scrapy.cmdline", "crawl", "sites"]
            for key, value in {
                    "METEORSEED_REDIS_URL": redis.url, "METEORSEED_NAMESPACE": "bench",
                    "METEORSEED_STORE_URI": f"sqlite:///{db}", "METEORSEED_IDLE_CLOSE": 5,
                    "METEORSEED_SITES_DIR": str(work / "sites"), "METEORSEED_CONSUMER": f"w{n}",
                    "LOG_FILE": str(work / f"w{n}.log")}.items():
                args += ["-s", f"{key}={value}"]
            procs.append(subprocess.Popen(args, cwd=PROJECT, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        last, count = started, 0
        while time.monotonic() - started < timeout and any(p.poll() is None for p in procs):
            now = stored(db)
            if now != count:
                count, last = now, time.monotonic()
            time.sleep(0.2)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        count = stored(db)
    site.shutdown()
    elapsed = last - started
    print(f"code {code}: {workers} workers, {pages} pages + 1 with {letters} a's, {regex}: "
          f"{count} items stored in {elapsed:.1f} s ({count / elapsed:.1f} items/s); "
          f"logs in {work}")


def big_page(links: int) -> http.server.ThreadingHTTPServer:
    """``/big``: ``links`` links to small pages without links."""
    big = ("<html><body><h1>big</h1>" + "".join(
        f'<a href="/p/{i}">{i}</a>' for i in range(links)) + "</body></html>").encode()
    return serve_pages(lambda path: (big if path == "/big" else b"<html><title>p</title></html>",
                                     {}))


def peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def until_acked(code: Path, url: str, timeout: float, settings: dict[str, object],
                spider_args: tuple[str, ...] = ()) -> tuple[float | None, float, Path]:
    """One ``probe`` worker crawls one task for ``url``: seconds from its start to the task's
    completion record (None: not within ``timeout``), its peak RSS (MB), its work dir."""
    import redis

    work = Path(tempfile.mkdtemp(prefix="meteorseed-page-"))
    keys = KeyLayout("bench")
    with RedisServer() as server:
        task = ExecTask.create(seed_id="bench", site_id="probe", url=url)
        run_with_client(server.url, lambda c: TaskWriter(c, keys).add([task]))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(PROJECT),
                                                           str(Path(__file__).parent)]))
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        args = [sys.executable, "-m", "scrapy.cmdline", "crawl", "probe"]
        for arg in spider_args:
            args += ["-a", arg]
        for key, value in {
                "METEORSEED_REDIS_URL": server.url, "METEORSEED_NAMESPACE": "bench",
                "METEORSEED_STORE_URI": f"sqlite:///{work / 'items.db'}",
                "METEORSEED_IDLE_CLOSE": 5, "LOG_FILE": str(work / "w.log"),
                "EXTENSIONS": json.dumps({"loop_lag.LoopLag": 0}),
                "LOOP_LAG_FILE": str(work / "lag"), **settings}.items():
            args += ["-s", f"{key}={value}"]
        client = redis.Redis.from_url(server.url)
        started = time.monotonic()
        proc = subprocess.Popen(args, cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        acked, peak = None, 0.0
        done_key = keys.for_site("probe").done(task.task_id)
        while time.monotonic() - started < timeout and proc.poll() is None:
            peak = max(peak, peak_rss_mb(proc.pid))
            if client.exists(done_key):
                acked = time.monotonic() - started
                break
            time.sleep(0.1)
        peak = max(peak, peak_rss_mb(proc.pid))
        proc.kill()
        proc.wait()
        client.close()
    return acked, peak, work


def acked_text(acked: float | None, timeout: float) -> str:
    return f"acked after {acked:.1f} s" if acked is not None else f"NOT acked in {timeout:.0f} s"


def longest_stall(work: Path) -> str:
    """The longest the worker's event loop was blocked (benchmarks/loop_lag.py)."""
    lag = work / "lag"
    return f"event loop blocked {float(lag.read_text()):.2f} s at most" if lag.exists() else \
        "event loop never blocked over 20 ms"


def run_links(code: Path, links: int, timeout: float) -> None:
    site = big_page(links)
    url = f"http://127.0.0.1:{site.server_address[1]}/big"
    acked, peak, work = until_acked(code, url, timeout, {"METEORSEED_SITE_CONCURRENCY": 4},
                                    ("follow=1",))
    site.shutdown()
    print(f"code {code}: a page of {links} links: parent {acked_text(acked, timeout)}, worker"
          f" peak RSS {peak:.0f} MB, {longest_stall(work)}; log in {work}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose add-on runs")
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--letters", type=int, default=27)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--links", type=int, default=0,
                        help="instead: one page of this many links (a code spider)")
    parser.add_argument("--regex", default="^(a+)+$", help="the title field's regex (the "
                        "report's; ^(a|aa)+$ defeats the regex module's own shortcuts too)")
    args = parser.parse_args()
    if args.links:
        run_links(args.code.resolve(), args.links, args.timeout)
        return
    run(args.code.resolve(), args.pages, args.letters, args.workers, args.timeout, args.regex)


if __name__ == "__main__":
    main()

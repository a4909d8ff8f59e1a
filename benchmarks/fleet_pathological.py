"""A fleet's throughput with one pathological page among ``--pages`` normal ones (issue 22).

``--workers`` ``probe`` workers (the test project's code spider, following every link) crawl
``--pages`` small pages and, in the middle of the stream, one bad page (``--bad``):

* ``headers``: a page with 300,000 header lines (9 MB of headers);
* ``links``: a page of 1,000,000 links (29 MB), each one followed by the spider;
* ``none``: no bad page (the reference).

The figure is the time from the workers' start to the completion record of the last of the
seeded tasks (the bad page's children, at most ``METEORSEED_MAX_CHILDREN_PER_TASK``, are not
waited for), and the seeded tasks per second. Each ``--code`` checkout (the add-on's code that
runs: this one, and e.g. a ``git worktree`` of an older commit) is run in turn, round after
round (``--rounds``), and the median is reported with the ratio to the first checkout's
run without a bad page:

    .venv/bin/python benchmarks/fleet_pathological.py --bad links --code . /tmp/before
"""

from __future__ import annotations

import argparse
import http.server
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from pathological_page import PROJECT, REPO, serve_pages  # noqa: E402

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter  # noqa: E402
from meteorseed_scrapy.queue.keys import KeyLayout  # noqa: E402
from meteorseed_scrapy.task.exec_task import ExecTask  # noqa: E402
from meteorseed_scrapy.testing.clients import run_with_client  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402

PAGE = b"<html><title>p</title><body>ok</body></html>"


def site(links: int, headers: int) -> http.server.ThreadingHTTPServer:
    big = ("<html><body>" + "".join(f'<a href="/c/{i}">{i}</a>' for i in range(links))
           + "</body></html>").encode()
    many = {f"X-Header-{i:07d}": "v" * 12 for i in range(headers)}

    def answer(path: str) -> tuple[bytes, dict[str, str]]:
        if path == "/links":
            return big, {}
        return PAGE, many if path == "/headers" else {}

    return serve_pages(answer)


def crawl(code: Path, base: str, pages: int, bad: str, workers: int, timeout: float) -> float:
    """Seconds until every seeded task of one crawl has its completion record."""
    import redis

    urls = [f"{base}/p/{i}" for i in range(pages)]
    if bad != "none":
        urls.insert(pages // 2, f"{base}/{bad}")
    keys = KeyLayout("bench")
    work = Path(tempfile.mkdtemp(prefix="meteorseed-fleet-"))
    with RedisServer() as server:
        tasks = [ExecTask.create(seed_id="bench", site_id="probe", url=u) for u in urls]
        run_with_client(server.url, lambda c: TaskWriter(c, keys).add(tasks))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(PROJECT)]))
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        client = redis.Redis.from_url(server.url)
        procs = []
        started = time.monotonic()
        for n in range(workers):
            args = [sys.executable, "-m", "scrapy.cmdline", "crawl", "probe", "-a", "follow=1"]
            for key, value in {
                    "METEORSEED_REDIS_URL": server.url, "METEORSEED_NAMESPACE": "bench",
                    "METEORSEED_STORE_URI": f"sqlite:///{work / 'items.db'}",
                    "METEORSEED_CONSUMER": f"w{n}", "METEORSEED_IDLE_CLOSE": 30,
                    "METEORSEED_SITE_CONCURRENCY": 16, "METEORSEED_SITE_RATE": 10_000,
                    "METEORSEED_SITE_BURST": 10_000, "ROBOTSTXT_OBEY": False,
                    "LOG_FILE": str(work / f"w{n}.log")}.items():
                args += ["-s", f"{key}={value}"]
            procs.append(subprocess.Popen(args, cwd=PROJECT, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        site_keys = keys.for_site("probe")
        left = {t.task_id for t in tasks}
        elapsed = timeout
        while time.monotonic() - started < timeout:
            pipe = client.pipeline(transaction=False)
            order = list(left)
            for task_id in order:
                pipe.exists(site_keys.done(task_id))
            left -= {t for t, there in zip(order, pipe.execute(), strict=True) if there}
            if not left:
                elapsed = time.monotonic() - started
                break
            time.sleep(0.2)
        for proc in procs:
            proc.kill()
            proc.wait()
        client.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, nargs="+", default=[REPO],
                        help="checkouts whose add-on runs (the first one is the reference)")
    parser.add_argument("--bad", choices=("headers", "links"), required=True)
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    server = site(1_000_000 if args.bad == "links" else 0,
                  300_000 if args.bad == "headers" else 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    runs = [(code.resolve(), bad) for code in args.code for bad in ("none", args.bad)]
    times: dict[tuple[Path, str], list[float]] = {run: [] for run in runs}
    for round_ in range(args.rounds):
        for code, bad in runs if round_ % 2 == 0 else runs[::-1]:  # (alternating order)
            took = crawl(code, base, args.pages, bad, args.workers, args.timeout)
            times[code, bad].append(took)
            print(f"round {round_ + 1}: code {code}, bad page {bad}: {took:.1f} s",
                  flush=True)
    server.shutdown()
    reference = statistics.median(times[runs[0]])
    for (code, bad), seconds in times.items():
        median = statistics.median(seconds)
        tasks = args.pages + (bad != "none")
        print(f"code {code}, bad page {bad}: median {median:.1f} s ({tasks / median:.1f} tasks/s"
              f", {reference / median:.2f}x the reference's throughput); runs "
              + ", ".join(f"{s:.1f}" for s in seconds))


if __name__ == "__main__":
    main()

"""``python -m meteorseed_scrapy.testing.demo``: the whole flow on this machine, end to end.

Starts a throwaway Redis and the demo site on free ports, writes a seeds file for the four
example rule sites of ``example_project/sites/`` (news list -> articles, a product catalogue, a
JSON API, and quotes that only exist after JavaScript runs), runs ``scrapy seed-expand`` and then
two ``scrapy crawl sites`` workers in parallel, waits for both to close when idle and prints a
summary that ends with one line per site: ``site <site_id>: <n> items stored``. Without Chromium
(``/usr/bin/chromium`` or ``METEORSEED_CHROMIUM_PATH``) the JavaScript site is skipped, and the
summary says so and why. Exit code 1 when a worker failed or nothing was stored (with
``--strict``, also when the counts differ from what the demo site holds).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.sites.render import DEFAULT_CHROMIUM, chromium_missing
from meteorseed_scrapy.testing.demo_pages import PER_PAGE
from meteorseed_scrapy.testing.redis_server import RedisServer
from meteorseed_scrapy.testing.sites import DemoSite

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_DIR = REPO_ROOT / "example_project"
NAMESPACE = "demo"
NEWS_PAGES, SHOP_CATEGORIES, JOBS_PAGES, JS_PAGES = 5, 3, 3, 3
JS_SITE = "example_quotes"  # the site rendered by the browser
#: items the demo site holds per site_id, when every page is fetched once
EXPECTED = {"example_news": NEWS_PAGES * PER_PAGE, "example_shop": SHOP_CATEGORIES * PER_PAGE,
            "example_jobs": JOBS_PAGES * PER_PAGE, JS_SITE: JS_PAGES * PER_PAGE}


def demo_seeds(base_url: str, *, js: bool = True) -> list[dict[str, Any]]:
    """Seeds for the demo site at ``base_url``: one per site, in the contract's JSON Lines shape
    (without the JavaScript site when ``js`` is false)."""
    base = base_url.rstrip("/")
    seeds: list[dict[str, Any]] = [
        {"seed_id": "news-front-page", "site_id": "example_news", "task_type": "url_list",
         "payload": {"urls": [f"{base}/news/list/1"]}},
        {"seed_id": "shop-index", "site_id": "example_shop", "task_type": "url_list",
         "payload": {"urls": [f"{base}/shop/"]}, "priority": 1},
        {"seed_id": "jobs-api", "site_id": "example_jobs", "task_type": "url_list",
         "payload": {"urls": [f"{base}/jobs/api?page=1"]}},
        {"seed_id": "quotes-js", "site_id": JS_SITE, "task_type": "url_list",
         "payload": {"urls": [f"{base}/js/quotes/1"]}},
    ]
    return seeds if js else [seed for seed in seeds if seed["site_id"] != JS_SITE]


def write_seeds(path: Path, base_url: str, *, js: bool = True) -> list[str]:
    """Write :func:`demo_seeds` to ``path``; return the site_ids in order."""
    seeds = demo_seeds(base_url, js=js)
    path.write_text("".join(json.dumps(seed) + "\n" for seed in seeds), encoding="utf-8")
    return [seed["site_id"] for seed in seeds]


def chromium_problem() -> tuple[str, str | None]:
    """``(path, why the JavaScript site cannot run)``; the reason is None when it can."""
    path = os.environ.get("METEORSEED_CHROMIUM_PATH") or DEFAULT_CHROMIUM
    problem = chromium_missing(path)
    if problem is None:
        return path, None
    return path, (f"{problem}; install the Debian package `chromium` (`make demo` does when run"
                  " as root where apt-get works) or set METEORSEED_CHROMIUM_PATH")


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("SCRAPY_SETTINGS_MODULE", None)  # the project's scrapy.cfg decides
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def _stat(log: str, name: str) -> int:
    """Sum of a numeric stat over every stats dump in a worker's log."""
    return sum(int(v) for v in re.findall(rf"'{re.escape(name)}': (\d+)", log))


def _stored_per_site(db: Path) -> dict[str, int]:
    if not db.exists():
        return {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute("SELECT json_extract(doc, '$.site_id'), COUNT(*) FROM items GROUP BY 1")
        return {str(site): int(n) for site, n in rows}
    except sqlite3.Error as exc:
        print(f"could not read {db}: {exc}", file=sys.stderr)
        return {}
    finally:
        con.close()


def _stream_lengths(url: str, keys: KeyLayout) -> tuple[int | str, int | str]:
    """XLEN of the dead-letter stream and of every task stream (all lanes and bands, summed),
    or ``"?"`` when Redis is gone (Ctrl-C)."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    try:
        return int(client.xlen(keys.dead)), sum(int(client.xlen(s)) for s in keys.streams)
    except redis.RedisError:
        return "?", "?"
    finally:
        client.close()


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(workers: int = 2, idle_close: float = 3, timeout: float = 600, strict: bool = False,
        workdir: Path | None = None, project: Path = PROJECT_DIR, js: bool = True) -> int:
    if not (project / "scrapy.cfg").exists():
        print(f"no Scrapy project at {project} (use --project)", file=sys.stderr)
        return 2
    work = workdir or Path(tempfile.mkdtemp(prefix="meteorseed-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    db, env, keys = work / "demo.db", _env(), KeyLayout(NAMESPACE)
    scrapy_cmd = [sys.executable, "-m", "scrapy"]
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    ok = False
    try:
        site = DemoSite(news_pages=NEWS_PAGES, shop_categories=SHOP_CATEGORIES,
                        jobs_pages=JOBS_PAGES, js_pages=JS_PAGES)
        chromium, skip_js = chromium_problem()
        if not js:
            skip_js = "left out (--no-js)"
        expected = {s: n for s, n in EXPECTED.items() if not (skip_js and s == JS_SITE)}
        with RedisServer(appendonly=True) as server, site:
            common = ["-s", f"METEORSEED_REDIS_URL={server.url}",
                      "-s", f"METEORSEED_NAMESPACE={NAMESPACE}",
                      "-s", f"METEORSEED_CHROMIUM_PATH={chromium}"]
            seeds = work / "demo.jsonl"
            site_ids = write_seeds(seeds, site.url, js=skip_js is None)
            kept = "" if workdir else " (removed at the end when all went well)"
            print(f"redis {server.url}, demo site {site.url}, files in {work}{kept}")
            if skip_js:
                print(f"skipping the JavaScript site {JS_SITE}: {skip_js}")
            else:
                print(f"JavaScript site {JS_SITE}: rendered by {chromium}")
            # The demo sites are on loopback: a sitemap seed added to the demo is fetched there.
            expand = subprocess.run([*scrapy_cmd, "seed-expand", str(seeds), *common,
                                     "-s", "METEORSEED_FETCH_PRIVATE_ADDRESSES=True"],
                                    cwd=project, env=env, capture_output=True, text=True,
                                    timeout=300)
            print(f"seed-expand: {expand.stdout.strip() or '(no output)'}")
            if expand.returncode != 0:
                print(f"seed-expand failed (exit {expand.returncode}):\n{expand.stderr[-3000:]}",
                      file=sys.stderr)
                return 1
            found = re.search(r"enqueued (\d+)", expand.stdout)
            enqueued = int(found.group(1)) if found else None

            started = time.monotonic()
            for i in range(1, workers + 1):
                logs.append(open(work / f"worker-{i}.log", "wb"))  # noqa: SIM115
                procs.append(subprocess.Popen(
                    [*scrapy_cmd, "crawl", "sites", *common,
                     "-s", f"METEORSEED_STORE_URI=sqlite:///{db}",
                     "-s", f"METEORSEED_IDLE_CLOSE={idle_close:g}",
                     "-s", f"METEORSEED_CONSUMER=worker-{i}"],
                    cwd=project, env=env, stdout=logs[-1], stderr=subprocess.STDOUT))
            print(f"started {workers} workers (logs: {work}/worker-N.log); waiting for them")
            deadline = started + timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.2)
            elapsed = time.monotonic() - started
            running = [p.poll() is None for p in procs]
            timed_out = any(running)
            _stop(procs)

            failed = []
            pages = errors = 0
            for i, proc in enumerate(procs, 1):
                text = (work / f"worker-{i}.log").read_text("utf-8", "replace")
                pages += _stat(text, "downloader/response_count")
                errors += _stat(text, "log_count/ERROR")
                if running[i - 1] or proc.returncode != 0:
                    failed.append(i)
                    print(f"--- worker-{i} exit {proc.returncode}, last lines of its log:\n"
                          + "\n".join(text.splitlines()[-25:]), file=sys.stderr)
            dead, left = _stream_lengths(server.url, keys)

        stored = _stored_per_site(db)
        busy = max(elapsed - idle_close, 0.001)
        print(f"tasks enqueued from seeds: {enqueued if enqueued is not None else '?'}")
        print(f"pages fetched: {pages} ({pages / busy:.1f} pages/s over {busy:.1f} s; "
              f"{elapsed:.1f} s elapsed including the {idle_close:g} s idle close)")
        print(f"items stored: {sum(stored.values())}")
        print(f"dead letters: {dead}; tasks left in the stream: {left}; logged errors: {errors}")
        if timed_out:
            print(f"workers were still running after {timeout:g} s and were stopped")
        mismatched = {s: n for s, n in expected.items() if stored.get(s, 0) != n}
        if mismatched:
            print("expected " + ", ".join(f"{s} {n}" for s, n in expected.items())
                  + ": counts differ")
        for site_id in [*site_ids, *sorted(set(stored) - set(site_ids))]:
            print(f"site {site_id}: {stored.get(site_id, 0)} items stored")
        if skip_js:
            print(f"site {JS_SITE}: 0 items stored (skipped: {skip_js})")
        ok = not failed and sum(stored.values()) > 0
        if strict:
            ok = ok and not mismatched and dead == left == 0
        return 0 if ok else 1
    finally:
        _stop(procs)
        for log in logs:
            log.close()
        if workdir is None and ok:
            shutil.rmtree(work, ignore_errors=True)
        elif not ok:
            print(f"(files kept in {work})", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--idle-close", type=float, default=3, help="METEORSEED_IDLE_CLOSE")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for workers")
    parser.add_argument("--strict", action="store_true",
                        help="also fail when counts differ, or tasks are dead or left over")
    parser.add_argument("--workdir", type=Path, help="keep seeds, logs and demo.db here")
    parser.add_argument("--project", type=Path, default=PROJECT_DIR, help="the Scrapy project")
    parser.add_argument("--print-seeds", metavar="BASE_URL",
                        help="print the demo seeds for a demo site at BASE_URL and exit")
    parser.add_argument("--no-js", action="store_true",
                        help="leave out the JavaScript site (it needs Chromium)")
    args = parser.parse_args(argv)
    if args.print_seeds:
        for seed in demo_seeds(args.print_seeds):
            print(json.dumps(seed))
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        code = run(args.workers, args.idle_close, args.timeout, args.strict,
                   args.workdir, args.project, js=not args.no_js)
    except KeyboardInterrupt:
        print("interrupted; workers stopped", file=sys.stderr)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()

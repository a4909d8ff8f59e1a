"""``python -m scrapy_suite``: Scrapy's own crawling tests, on stock Scrapy and with the add-on.

Gets the sdist of the installed Scrapy version (once, into ``.scrapy-suite/``), runs the test
files below twice (the second time with ``-p scrapy_suite.plugin``, which switches the add-on on
for every crawler), compares the two runs against ``differences.txt`` and writes the summary to
``.scrapy-suite/summary.md``. Exit status 1 only when a test that passes on stock Scrapy fails
with the add-on and is not listed in ``differences.txt`` (and fails again when run once more,
alone: Scrapy's tests of timing may fail on a busy machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import scrapy

from scrapy_suite.injection import HOOK_DIR, REDIS_URL_ENV, WORKDIR_ENV
from scrapy_suite.plugin import SessionRedis
from scrapy_suite.report import compare, render
from scrapy_suite.results import Run, load_differences

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".scrapy-suite"
DIFFERENCES = Path(__file__).resolve().parent / "differences.txt"
FILES = (
    "test_crawl.py", "test_engine.py", "test_engine_loop.py", "test_crawler.py",
    "test_spider_start.py", "test_spidermiddleware*.py", "test_request_cb_kwargs.py",
    "test_request_left.py", "test_core_scraper.py", "test_pipeline_crawl.py",
    "test_scheduler.py", "test_closespider.py", "test_downloadermiddleware_retry.py",
    "test_engine_close_spider.py", "test_engine_download.py", "test_engine_stop_download_*.py",
    "test_request_attribute_binding.py", "test_signals.py", "test_scheduler_base.py",
    "test_spider_crawl.py", "test_spider_sitemap.py",
    # components built on a crawler with the add-on's settings, and crawls of their own
    "test_addons.py", "test_contracts.py", "test_core_downloader.py", "test_crawler_runners.py",
    "test_downloader_handlers.py", "test_downloadermiddleware*.py",
    "test_downloaderslotssettings.py", "test_dupefilters.py", "test_extension_*.py",
    "test_feedexport.py", "test_feedexport_batch.py", "test_feedexport_postprocess.py",
    "test_logformatter.py", "test_logstats.py", "test_pipeline_files.py", "test_pipelines.py",
    "test_pqueues.py", "test_request_dict.py", "test_settings/__init__.py", "test_spider.py",
    "test_spiderloader/__init__.py", "test_spiderstate.py", "test_squeues_request.py",
    "test_stats.py", "test_utils_request.py",
    # Scrapy's commands, in subprocesses (scrapy_suite.injection reaches them)
    "test_command_*.py", "test_commands.py",
)
# Seconds before a test counts as hung: the slowest stock test takes under 10 s, and a test
# whose callback fails waits out the add-on's redelivery backoff (about a minute) first.
TIMEOUT = 120
JOBS = 4


def sdist_tree(version: str) -> Path:
    """Scrapy's sdist at ``version``, downloaded and unpacked once."""
    tree = CACHE / f"scrapy-{version}"
    if (tree / "tests").is_dir():
        return tree
    CACHE.mkdir(exist_ok=True)
    archive = CACHE / f"scrapy-{version}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                        "--disable-pip-version-check", "--no-binary", ":all:", "--no-deps",
                        f"scrapy=={version}", "--dest", str(CACHE)], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return tree


def test_files(tree: Path, patterns: tuple[str, ...]) -> list[str]:
    found: list[str] = []
    for pattern in patterns:
        matches = sorted(tree.glob(f"tests/{pattern}"))
        if not matches:
            raise SystemExit(f"no Scrapy test file matches tests/{pattern} in {tree}")
        found += [name for name in (str(path.relative_to(tree)) for path in matches)
                  if name not in found]
    return found


def collect(tree: Path, files: list[str], env: dict[str, str], extra: list[str]) -> list[str]:
    """The node ids of the tests in ``files``, in pytest's order."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                          "--collect-only", "-q", *extra, *files], cwd=tree, env=env,
                         capture_output=True, text=True, check=False)
    nodeids = [line for line in out.stdout.splitlines() if "::" in line]
    if not nodeids:
        raise SystemExit(f"pytest collected no test in {files}:\n{out.stdout}{out.stderr}")
    return nodeids


def shards(nodeids: list[str], jobs: int) -> list[list[str]]:
    """Every ``jobs``-th test to each pytest process: a file's slow tests (those that wait out
    the add-on's redelivery backoff) sit together, so whole files would not balance."""
    count = max(1, min(jobs, len(nodeids)))
    return [nodeids[start::count] for start in range(count)]


def run_side(name: str, tree: Path, files: list[str], *, addon: bool, timeout: float,
             jobs: int, extra: list[str]) -> Run:
    """One side's run, in ``jobs`` pytest processes at once (the add-on's share one Redis)."""
    # (HOOK_DIR: every Python of the run, stock or not, looks up loopback names only)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH"), str(HOOK_DIR)])))
    for old in [*CACHE.glob(f"{name}.*.jsonl"), *CACHE.glob(f"{name}.*.log")]:
        old.unlink()
    groups = shards(collect(tree, files, env, extra), jobs)
    print(f"== {name}: {sum(map(len, groups))} tests of {len(files)} files in {len(groups)} "
          f"pytest processes, logs {CACHE}/{name}.*.log", flush=True)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if addon:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="scrapy-suite-"))
            redis = SessionRedis(workdir)
            stack.callback(redis.close)
            env.update({REDIS_URL_ENV: redis.url, WORKDIR_ENV: workdir})
        with ThreadPoolExecutor(len(groups)) as pool:
            statuses = list(pool.map(
                lambda numbered: _run_shard(f"{name}.{numbered[0]}", tree, numbered[1],
                                            addon=addon, timeout=timeout, env=env, extra=extra),
                enumerate(groups, 1)))
    result = Run.load(name, sorted(CACHE.glob(f"{name}.*.jsonl")))
    result.seconds, result.status = time.monotonic() - started, max(statuses)
    print(f"   {name}: {result.seconds:.0f} s", flush=True)
    return result


def _run_shard(name: str, tree: Path, files: list[str], *, addon: bool, timeout: float,
               env: dict[str, str], extra: list[str]) -> int:
    """One pytest process's files; resumed with the tests left whenever a hang ends it."""
    record, log_path = CACHE / f"{name}.jsonl", CACHE / f"{name}.log"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
            "-p", "scrapy_suite.record", f"--suite-record={record}",
            f"--timeout={timeout}", "--timeout-method=thread",
            *(["-p", "scrapy_suite.plugin"] if addon else [])]
    targets, status = files, 0
    with open(log_path, "w", encoding="utf-8") as log:
        while targets:
            status = _pytest([*args, *extra, *targets], tree, env, log)
            left = Run.load(name, [record]).not_run()
            # Collected but never reported: the process ended in the middle (pytest-timeout's
            # thread method exits with status 1, as a run with failures does).
            if not left or _stopping.is_set():
                break
            _mark_hung(record, left[0], status, log_path)
            print(f"   {left[0]}: hung (pytest exit status {status}); going on with the "
                  f"{len(left) - 1} tests left", flush=True)
            targets = left[1:]
    return status




_running: set[int] = set()  # process groups of the pytest processes running
_stopping = threading.Event()


def _pytest(args: list[str], tree: Path, env: dict[str, str], log: IO[str]) -> int:
    """pytest in a process group of its own: a test's servers left behind by a hang go too."""
    process = subprocess.Popen(args, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    _running.add(process.pid)
    try:
        return process.wait()
    finally:
        _running.discard(process.pid)
        _kill_group(process.pid)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _stop(signum: int, frame: object) -> None:
    """SIGTERM, SIGINT: end the pytest processes (each in a group of its own) and leave."""
    _stopping.set()
    for pgid in list(_running):
        _kill_group(pgid)
    raise SystemExit(128 + signum)


def _mark_hung(record: Path, nodeid: str, status: int, log_path: Path) -> None:
    """The test running when pytest-timeout ended the process: its outcome, and the stacks
    pytest-timeout dumped (the log's tail) as the detail."""
    tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-80:]
    timed_out = any("Timeout" in line for line in tail)
    message = ("Timeout: no result within the timeout (pytest-timeout ended the run)"
               if timed_out else f"the pytest process died (exit status {status})")
    with open(record, "a", encoding="utf-8") as stream:
        stream.write(json.dumps({"nodeid": nodeid, "outcome": "failed", "message": message,
                                 "timeout": timed_out, "detail": "\n".join(tail)}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_suite", description=__doc__)
    parser.add_argument("--only", choices=("stock", "addon", "none"),
                        help="run one side (or none) and reuse the other's last record")
    parser.add_argument("--jobs", type=int, default=JOBS,
                        help="pytest processes at once, each a share of the files (default "
                             "%(default)s: most of the add-on's time is spent waiting)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT,
                        help="seconds before a test counts as hung (default %(default)s)")
    parser.add_argument("--files", nargs="+", default=list(FILES),
                        help="file names (globs) under Scrapy's tests/ (default: the list in "
                             "scrapy_suite/run.py)")
    parser.add_argument("--no-retry", dest="retry", action="store_false",
                        help="do not run a test that fails unexpectedly once more")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    tree = sdist_tree(scrapy.__version__)
    files = test_files(tree, tuple(args.files))
    runs: dict[str, Run] = {}
    for name, addon in (("stock", False), ("addon", True)):
        if args.only and args.only != name:
            runs[name] = Run.load(name, sorted(CACHE.glob(f"{name}.*.jsonl")))
        else:
            runs[name] = run_side(name, tree, files, addon=addon, timeout=args.timeout,
                                  jobs=args.jobs, extra=args.pytest_args)
    comparison = compare(runs["stock"], runs["addon"], load_differences(DIFFERENCES))
    if comparison.unexpected and args.only in (None, "addon") and args.retry:
        # Once more, alone: a timing-sensitive test of Scrapy's may fail on a busy machine.
        again = run_side("rerun", tree, [o.nodeid for o in comparison.unexpected], addon=True,
                         timeout=args.timeout, jobs=1, extra=args.pytest_args)
        comparison.flaky = [o for o in comparison.unexpected if again.passed(o.nodeid)]
        comparison.unexpected = [o for o in comparison.unexpected if not again.passed(o.nodeid)]
    text = render(scrapy.__version__, files, runs["stock"], runs["addon"], comparison)
    (CACHE / "summary.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"(written to {CACHE / 'summary.md'})")
    return 1 if comparison.unexpected else 0

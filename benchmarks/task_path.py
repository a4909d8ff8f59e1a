"""Which ``meteorseed_scrapy`` modules and functions one task visits, from its seed line to its ack.

One real task, end to end, on loopback: a throwaway Redis, the benchmark site, a ``scrapy
crawl bench`` worker of ``bench_project/`` started first and left to idle, then ``scrapy
seed-expand`` of a one-line seed file naming one page of the site. Both commands run in
subprocesses under a profiler (``sys.setprofile``, and ``threading.setprofile`` for threads
started later) that notes, with the wall-clock time, every entry into a ``meteorseed_scrapy``
function (a coroutine's or generator's resumption counts as an entry) and the real returns of
the two marker functions below. Only entries inside the task's window count:

* ``seed-expand``: from the first entry into ``seeding.seed_lines.read_lines`` (the seed line
  is read) to the real return of ``TaskWriter.enqueue`` (the task is in the stream; before
  issue 23, ``TaskWriter.add_encoded``, so that an older commit is measured the same way);
* the worker: from that moment (it cannot have the task earlier) to the real return of
  ``Completions._complete`` (the pipeline with the XACK has answered).

For scale, the same profiler counts Scrapy's own modules (``scrapy.*``): those the worker's
window enters, and those stock Scrapy enters for the same page, crawled by the same spider from
a URL file with a JSON Lines feed (from the first entry into the scheduler's
``enqueue_request``, the request is queued, to the real return of the scraper's
``start_itemproc_async``, the item went through the pipelines and the feed exporter).

Start-up and shut-down fall outside the windows. The worker's periodic loops (reads, the
liveness heartbeat, flushes) do run inside its window; a module whose every function entered in
the window was also entered while the worker idled before the task came is listed apart, as
background rather than the task's path.

    python benchmarks/task_path.py [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import ast
import dis
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PACKAGE = "meteorseed_scrapy"
SCRAPY = "scrapy"
#: What the profiler notes: this package's functions and Scrapy's.
TRACED = (PACKAGE + ".", SCRAPY + ".")
START_READ = ("meteorseed_scrapy.seeding.seed_lines", "read_lines")
# (bare names, as Python 3.10's code objects know them: each is the only one in its module)
END_ENQUEUE = ("meteorseed_scrapy.queue.enqueue.writer", "enqueue")  # TaskWriter.enqueue
#: TaskWriter's entry point before issue 23 (to measure an older commit the same way)
END_ENQUEUE_BEFORE = ("meteorseed_scrapy.queue.writer", "add_encoded")
END_ACK = ("meteorseed_scrapy.worker.completions", "_complete")  # Completions._complete
#: Stock Scrapy's window: the request is queued, the item is through.
STOCK_START = ("scrapy.core.scheduler", "enqueue_request")
STOCK_END = ("scrapy.core.scraper", "start_itemproc_async")
MARKERS = {START_READ, END_ENQUEUE, END_ENQUEUE_BEFORE, END_ACK, STOCK_END}
#: The opcodes of a real return (RETURN_CONST since 3.12).
_RETURNS = frozenset(dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST")
                     if name in dis.opmap)


# -- in the traced subprocess ------------------------------------------------------------------

def returned(frame: FrameType) -> bool:
    """At a ``return`` event: the function really returned (a coroutine or generator that only
    suspends at an ``await`` or ``yield`` raises the same event)."""
    return frame.f_code.co_code[frame.f_lasti] in _RETURNS


def _qualname(frame: FrameType) -> str:
    code = frame.f_code
    return str(getattr(code, "co_qualname", code.co_name))  # (3.10: the bare name)


def _traced(out: Path, argv: list[str]) -> None:
    """Run Scrapy's command line ``argv`` under the profiler; the record goes to ``out`` at exit."""
    import atexit

    calls: list[tuple[float, str, str]] = []
    returns: list[tuple[float, str, str]] = []
    clock = time.time

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith(TRACED):
                calls.append((clock(), module, _qualname(frame)))
        elif event == "return":
            module = frame.f_globals.get("__name__", "")
            name = frame.f_code.co_name
            if (module, name) in MARKERS and returned(frame):
                returns.append((clock(), module, name))

    def dump() -> None:
        sys.setprofile(None)
        out.write_text(json.dumps({"calls": calls, "returns": returns}))

    atexit.register(dump)
    threading.setprofile(profile)
    sys.setprofile(profile)
    from scrapy.cmdline import execute

    execute(["scrapy", *argv])


# -- in the harness ----------------------------------------------------------------------------

def _first(events: Iterable[list[Any]], marker: tuple[str, str]) -> float | None:
    """When ``marker`` (module, bare name) was first met."""
    return next((t for t, m, f in events if (m, f.rpartition(".")[2]) == marker), None)


def _last(events: Iterable[list[Any]], marker: tuple[str, str]) -> float | None:
    times = [t for t, m, f in events if (m, f.rpartition(".")[2]) == marker]
    return times[-1] if times else None


def _visited(calls: list[list[Any]], start: float, end: float,
             package: str = PACKAGE) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for t, module, func in calls:
        if start <= t <= end and module.startswith(package + "."):
            seen.setdefault(module, set()).add(func)
    return seen


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".")


def _function_spans(text: str) -> dict[str, int]:
    """Lines of each function and method in the source ``text`` (decorators included), by the
    qualified name a profiler sees; nested functions are counted within the one they are in."""
    spans: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                spans[prefix + child.name] = (child.end_lineno or child.lineno) - first + 1
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(text), "")
    return spans


def _source(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # (a parent package that is not there)
        return None
    return None if spec is None or spec.origin is None else Path(spec.origin)


def code_size(path: dict[str, set[str]]) -> dict[str, int]:
    """The lines of the functions entered (``ran``) and of their whole modules (``modules``)."""
    ran = total = 0
    for module, funcs in path.items():
        source = _source(module)
        if source is None:
            continue
        text = source.read_text()
        total += len(text.splitlines())
        spans = _function_spans(text)
        # (3.10's code objects give bare names: a method counts by its bare name there; a
        # nested or generated function, "<locals>", is within another or in no source)
        bare = {name.rpartition(".")[2]: n for name, n in spans.items()}
        ran += sum(spans.get(f, bare.get(f, 0)) for f in funcs if "<locals>" not in f)
    return {"ran": ran, "modules": total}


def _streams_empty(redis_url: str, namespace: str) -> bool:
    """No task in any stream and none pending: the task was acked (XACK and XDEL go together)."""
    import redis

    from meteorseed_scrapy.queue.keys import KeyLayout

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for stream in KeyLayout(namespace).streams:
            if client.exists(stream) and client.xlen(stream):
                return False
        return True
    finally:
        client.close()


def scrapy_modules(traced: dict[str, list[list[Any]]], start: float, end: float) -> int:
    """How many of Scrapy's own modules a window entered."""
    return len(_visited(traced["calls"], start, end, SCRAPY))


def summarise_stock(traced: dict[str, list[list[Any]]]) -> dict[str, Any]:
    """Stock Scrapy's figures for the page, from its crawl's record."""
    start, end = _first(traced["calls"], STOCK_START), _first(traced["returns"], STOCK_END)
    if start is None or end is None:
        raise RuntimeError(f"a stock marker was not reached: queued={start} through={end}")
    seen = _visited(traced["calls"], start, end, SCRAPY)
    return {"window_s": round(end - start, 3), "scrapy_modules": len(seen),
            "scrapy_functions": sum(len(f) for f in seen.values())}


def summarise(expand: dict[str, list[list[Any]]], traced: dict[str, list[list[Any]]],
              ready: float) -> dict[str, Any]:
    """The figures from the two records (``calls`` and ``returns`` of ``[time, module,
    function]``); ``ready``: when the worker started idling, waiting for the task."""
    start = _first(expand["calls"], START_READ)
    enqueued = _last(expand["returns"], END_ENQUEUE) or _last(expand["returns"],
                                                              END_ENQUEUE_BEFORE)
    acked = _first(traced["returns"], END_ACK)
    if start is None or enqueued is None or acked is None:
        raise RuntimeError(f"a marker was not reached: read={start} enqueued={enqueued} "
                           f"acked={acked}")
    phases = {"seed-expand": _visited(expand["calls"], start, enqueued),
              "worker": _visited(traced["calls"], enqueued, acked)}
    idle = _visited(traced["calls"], ready, enqueued)
    background = sorted(m for m, funcs in phases["worker"].items()
                        if funcs <= idle.get(m, set()))
    union: dict[str, set[str]] = {}
    for seen in phases.values():
        for module, funcs in seen.items():
            union.setdefault(module, set()).update(funcs)
    path = {m: f for m, f in union.items() if m not in background}
    return {
        "window_s": {"seed_expand": round(enqueued - start, 3),
                     "worker": round(acked - enqueued, 3)},
        "phases": {name: {"modules": sorted(_short(m) for m in seen),
                          "functions": sum(len(f) for f in seen.values())}
                   for name, seen in phases.items()},
        "background": [_short(m) for m in background],
        "modules": sorted(_short(m) for m in union),
        "functions": sum(len(f) for f in union.values()),
        "path_modules": {_short(m): len(path[m]) for m in sorted(path)},
        "path_functions": sum(len(f) for f in path.values()),
        "path_lines": code_size(path),
        "worker_scrapy_modules": scrapy_modules(traced, enqueued, acked),
    }


def run(keep: str | None) -> dict[str, Any]:
    from _crawl_rig import PROJECT, SRC, bench_rig, source_label, start_worker, wait_until

    namespace = "task_path"
    with bench_rig(keep, "task_path_") as (workdir, server, site):
        common = {"METEORSEED_REDIS_URL": server.url, "METEORSEED_NAMESPACE": namespace,
                  "METEORSEED_STORE_URI": f"sqlite:///{workdir / 'items.db'}"}
        worker_trace = workdir / "worker.trace.json"
        worker = start_worker(workdir, "worker", "bench", "bench.settings_meteorseed", common,
                              wrapper=[sys.executable, __file__, "--traced",
                                       str(worker_trace), "--"])
        try:
            wait_until(lambda: "StreamScheduler reading" in worker.log(), 60)
            ready = time.time()
            time.sleep(1.0)  # an idle second: the worker's loops show what is background
            seeds = workdir / "seeds.jsonl"
            seeds.write_text(json.dumps({
                "seed_id": "path", "site_id": "bench", "task_type": "url_list",
                "payload": {"urls": [f"{site.url}/item/1"]}}) + "\n")
            expand_trace = workdir / "expand.trace.json"
            args = ["seed-expand", str(seeds)]
            for key, value in common.items():
                args += ["-s", f"{key}={value}"]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, str(PROJECT)]),
                       SCRAPY_SETTINGS_MODULE="bench.settings_meteorseed")
            subprocess.run([sys.executable, __file__, "--traced", str(expand_trace), "--",
                            *args], cwd=PROJECT, env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_until(lambda: _streams_empty(server.url, namespace), 60)
        finally:
            worker.proc.send_signal(signal.SIGINT)  # Scrapy's graceful stop: the trace is saved
            worker.wait(60)
        expand = json.loads(expand_trace.read_text())
        traced = json.loads(worker_trace.read_text())
        stock = _stock_trace(workdir, f"{site.url}/item/1")
        source = source_label()

    return {"source": source, **summarise(expand, traced, ready),
            "stock": summarise_stock(stock)}


def _stock_trace(workdir: Path, url: str) -> dict[str, list[list[Any]]]:
    """Stock Scrapy's record of the same spider crawling ``url`` (from a URL file, to a feed)."""
    from _crawl_rig import start_worker

    urls = workdir / "stock-urls.txt"
    urls.write_text(url + "\n")
    trace = workdir / "stock.trace.json"
    stock = start_worker(workdir, "stock", "bench", "bench.settings_stock",
                         {"FEEDS": {str(workdir / "stock.jsonl"): {"format": "jsonlines"}}},
                         spider_args={"urls_file": str(urls)},
                         wrapper=[sys.executable, __file__, "--traced", str(trace), "--"])
    if stock.wait(120) != 0:
        raise RuntimeError("the stock crawl failed; log tail:\n" + stock.log()[-3000:])
    return dict(json.loads(trace.read_text()))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--traced"]:
        # argv: --traced OUT -- [python -m scrapy.cmdline] ARGS...
        rest = argv[3:]
        if rest[1:3] == ["-m", "scrapy.cmdline"]:
            rest = rest[3:]
        _traced(Path(argv[1]), rest)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", help="work directory to keep (logs, traces)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = run(args.keep)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(result["source"])
    for name, phase in result["phases"].items():
        print(f"{name} ({result['window_s'][name.replace('-', '_')]}s window): "
              f"{len(phase['modules'])} modules, {phase['functions']} functions")
    print(f"one task, seed line -> ack: {len(result['modules'])} modules, "
          f"{result['functions']} functions")
    print(f"  of which the worker's background loops only: {len(result['background'])} "
          f"modules ({', '.join(result['background']) or 'none'})")
    lines = result["path_lines"]
    print(f"  the task's own path: {len(result['path_modules'])} modules, "
          f"{result['path_functions']} functions ({lines['ran']} lines, in modules of "
          f"{lines['modules']} lines; per module, the functions entered):")
    for module, count in result["path_modules"].items():
        print(f"    {module} ({count})")
    stock = result["stock"]
    print(f"for scale, Scrapy's own modules: {result['worker_scrapy_modules']} in the worker's "
          f"window; stock Scrapy, the same page from queued to item through "
          f"({stock['window_s']}s): {stock['scrapy_modules']} modules, "
          f"{stock['scrapy_functions']} functions")


if __name__ == "__main__":
    main()

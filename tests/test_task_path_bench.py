"""The counting of benchmarks/task_path.py: the task's windows, real returns, background loops."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "task_path.py"
M = "meteorseed_scrapy."


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("task_path", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_suspended_coroutine_has_not_returned() -> None:
    bench = load()
    seen: list[bool] = []

    async def marker() -> int:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return 1

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is marker.__code__:
            seen.append(bench.returned(frame))

    sys.setprofile(profile)
    try:
        asyncio.run(marker())
    finally:
        sys.setprofile(None)
    assert seen == [False, False, True]


def test_only_the_windows_count_and_idle_loops_are_set_apart() -> None:
    bench = load()
    expand = {
        "calls": [[1.0, M + "commands.seed_expand", "Command.run"],  # start-up: before the read
                  [2.0, M + "seeding.seed_lines", "read_lines"],
                  [2.1, M + "seeding.expand", "expand"],
                  [2.2, M + "queue.enqueue.writer", "TaskWriter.enqueue"],
                  [9.0, M + "commands.report", "say"]],  # after the task is in the stream
        "returns": [[2.3, M + "queue.enqueue.writer", "enqueue"]],
    }
    worker = {
        "calls": [[0.5, M + "worker.crawl", "WorkerCrawl.open"],  # start-up
                  [1.5, M + "worker.loops", "Loops.tick"],  # idle, before the task
                  [1.6, M + "queue.consume.consumer", "StreamConsumer.read"],
                  [2.4, M + "worker.loops", "Loops.tick"],  # the same loop, in the window
                  [2.5, M + "queue.consume.consumer", "StreamConsumer.read"],
                  [2.6, M + "queue.consume.delivery", "decode"],  # the task's own
                  [2.7, M + "worker.completions", "Completions._complete"],
                  [5.0, M + "worker.shutdown", "stop"]],  # shut-down
        "returns": [[2.8, M + "worker.completions", "_complete"]],
    }
    result = bench.summarise(expand, worker, ready=1.2)
    assert result["phases"]["seed-expand"] == {
        "modules": ["queue.enqueue.writer", "seeding.expand", "seeding.seed_lines"],
        "functions": 3}
    assert result["phases"]["worker"]["functions"] == 4
    # a module all of whose entries in the window also happened while idling is background,
    # even the consumer's read (the heuristic's limit: the count of the path is a floor)
    assert result["background"] == ["queue.consume.consumer", "worker.loops"]
    assert result["path_modules"] == {
        "queue.consume.delivery": 1, "queue.enqueue.writer": 1, "seeding.expand": 1,
        "seeding.seed_lines": 1, "worker.completions": 1}
    assert len(result["modules"]) == 7 and result["functions"] == 7
    assert result["window_s"] == {"seed_expand": 0.3, "worker": 0.5}


def test_a_missing_marker_is_an_error_not_a_figure() -> None:
    bench = load()
    with pytest.raises(RuntimeError, match="marker"):
        bench.summarise({"calls": [], "returns": []}, {"calls": [], "returns": []}, ready=0.0)


def test_code_size_counts_the_functions_entered_and_their_modules() -> None:
    bench = load()
    module = M + "task.lanes"  # (one function, band_of: lines 13-15 of a 15-line module)
    source = Path(bench._source(module) or "").read_text().splitlines()
    start = next(i for i, line in enumerate(source) if line.startswith("def band_of"))
    size = bench.code_size({module: {"band_of", "band_of.<locals>.<genexpr>"},
                            M + "no_such_module": {"f"}})
    assert size == {"ran": len(source) - start, "modules": len(source)}

"""The MONITOR counting of benchmarks/redis_commands_per_task.py, on a real Redis's output."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import redis

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "redis_commands_per_task.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("redis_commands_per_task", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_counts_top_level_commands_and_leaves_out_lua(redis_url: str, namespace: str) -> None:
    bench = load()
    monitor = bench.Monitor(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.set(f"{namespace}:a", "1")
        client.get(f"{namespace}:a")
        # One script call running three commands: counts as one EVAL.
        client.eval("redis.call('INCR', KEYS[1]); redis.call('INCR', KEYS[1]); "
                    "return redis.call('GET', KEYS[1])", 1, f"{namespace}:n")
        client.ping()  # the last command: once MONITOR shows it, the others are there too
        deadline = time.monotonic() + 10
        while not any('"PING"' in line.upper() for line in monitor.lines):
            assert time.monotonic() < deadline, monitor.lines
            time.sleep(0.01)
    finally:
        lines = monitor.stop()
        client.close()
    top, in_lua = bench.count_commands(lines)
    assert in_lua == 3
    assert top["SET"] == 1 and top["GET"] == 1 and top["EVAL"] == 1 and top["PING"] == 1
    assert "INCR" not in top

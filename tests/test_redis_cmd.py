"""``meteorseed redis``: a local Redis in the foreground with the AOF on, printing its URL; the
data survives a stop and a start; bad options are one-line errors."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import redis

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import free_port

SCRIPT = Path(sys.executable).with_name("meteorseed")


def start(data: Path, port: int) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([str(SCRIPT), "redis", "--dir", str(data), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        found = re.search(r"METEORSEED_REDIS_URL=(\S+)", line)
        if found:
            return process, found.group(1)
    raise AssertionError(f"no URL printed; exit {process.wait()}")


def stop(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(20)
    finally:
        if process.stdout:
            process.stdout.close()


def ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def test_runs_in_the_foreground_with_the_aof_and_keeps_data(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    process, url = start(data, port)
    try:
        assert url == f"redis://127.0.0.1:{port}/0"
        wait_for(lambda: ping(url), timeout=20)
        client = redis.Redis.from_url(url, decode_responses=True)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert client.config_get("dir")["dir"] == str(data.resolve())
        client.set("kept", "yes")
        client.close()
    finally:
        assert stop(process) == 0
    assert any(p.name.startswith("appendonly") for p in data.iterdir())
    process, url = start(data, port)
    try:
        wait_for(lambda: ping(url), timeout=20)
        assert redis.Redis.from_url(url, decode_responses=True).get("kept") == "yes"
    finally:
        stop(process)


def test_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    err = io.StringIO()
    assert main(["redis", "--port", "0"], stdout=io.StringIO(), stderr=err) == 2
    assert "argument --port" in err.getvalue()
    blocker = tmp_path / "file"
    blocker.write_text("")
    err = io.StringIO()
    code = main(["redis", "--dir", str(blocker / "sub")], stdout=io.StringIO(), stderr=err)
    assert code == 2 and "argument --dir" in err.getvalue()


def test_a_taken_port_is_an_error_exit(tmp_path: Path, redis_server: object) -> None:
    port = int(str(redis_server.port))
    result = subprocess.run([str(SCRIPT), "redis", "--dir", str(tmp_path), "--port", str(port)],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ})
    assert result.returncode == 2 and "exited with" in result.stderr

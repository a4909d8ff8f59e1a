"""A killed test run (SIGKILL: none of its clean-up runs) leaves none of the servers its rig
started running: each is killed with the process that started it (testing/parent_death.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from meteorseed_scrapy.testing import parent_death
from meteorseed_scrapy.testing.polling import wait_for
from tests.subprocess_env import python_path

ROOT = Path(__file__).resolve().parents[1]

needs_setpriv = pytest.mark.skipif(
    parent_death.setpriv() is None,
    reason="no setpriv that sets a parent-death signal (util-linux 2.33+)")

#: Started in a child process that prints the server's pid and directory, then waits to be
#: killed.
REDIS = ("from meteorseed_scrapy.testing.redis_server import RedisServer\n"
         "server = RedisServer(workdir={workdir!r}).start()\n")
POSTGRES = ("from meteorseed_scrapy.testing.postgres import PostgresServer, PostgresMissing\n"
            "try:\n"
            "    server = PostgresServer(fsync=False).start()\n"
            "except PostgresMissing as exc:\n"
            "    print('missing', exc, flush=True)\n"
            "    raise SystemExit(0)\n")


def _killed_starter_leaves_nothing(start: str) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c",
         f"import sys\n{start}print(server.process.pid, server.workdir, flush=True)\n"
         "sys.stdin.read()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=python_path(ROOT, os.environ.get("PYTHONPATH", ""))))
    pid, workdir = None, None
    try:
        assert starter.stdout is not None
        line = starter.stdout.readline()
        if line.startswith("missing"):
            pytest.skip(f"no PostgreSQL to test against: {line.strip()}")
        pid, workdir = int(line.split()[0]), line.split()[1]
        assert not parent_death.ended(pid)
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        wait_for(lambda: parent_death.ended(pid), timeout=30)
    finally:
        starter.kill()
        starter.wait()
        # (the test failed: never leave the server behind)
        if pid is not None and not parent_death.ended(pid):
            os.kill(pid, signal.SIGKILL)
        if workdir is not None:  # (the starter's clean-up never ran)
            shutil.rmtree(workdir, ignore_errors=True)


@needs_setpriv
def test_a_redis_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    _killed_starter_leaves_nothing(REDIS.format(workdir=str(tmp_path)))


@needs_setpriv
def test_a_postgres_server_dies_with_the_process_that_started_it() -> None:
    """Run as an unprivileged user when the tests run as root: the signal is set after the
    change of user, which would clear it."""
    _killed_starter_leaves_nothing(POSTGRES)


def test_a_server_started_by_another_thread_is_left_to_its_owner() -> None:
    """The signal follows the thread that forked: a server started from a thread that ends
    first would die with it, so only the main thread's servers get one."""
    argv = ["redis-server", "--port", "1"]
    seen: list[list[str]] = []
    thread = threading.Thread(target=lambda: seen.append(parent_death.dying_with_parent(argv)))
    thread.start()
    thread.join()
    assert seen == [argv]
    setpriv = parent_death.setpriv()
    assert parent_death.dying_with_parent(argv) == (
        argv if setpriv is None else [setpriv, "--pdeathsig", "KILL", "--", *argv])

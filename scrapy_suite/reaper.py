"""Ends a process and removes directories once its owner is gone, however the owner ended.

pytest-timeout's thread method ends a hung pytest with ``os._exit``: no ``pytest_unconfigure``,
no ``atexit``, so the session's redis-server and temporary directories would outlive it. The
reaper is a process of its own session holding the read end of a pipe whose only write end
belongs to the owner: the owner's end closes when it exits by any means (``os._exit``,
SIGKILL included), and the reaper then terminates the pid and removes the directories.

``python -m scrapy_suite.reaper PID [DIR...]`` (started by :func:`reap_on_exit`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

from meteorseed_scrapy.testing.parent_death import ended

# Seconds a SIGTERMed redis-server gets to exit before SIGKILL.
GRACE = 5.0


def reap_on_exit(pid: int, *directories: str) -> subprocess.Popen[bytes]:
    """Start the reaper of ``pid`` and ``directories``. Closing its ``stdin`` (what the
    owner's exit does) sets it off; the owner may close it itself after its own cleanup."""
    # The write end (the reaper's stdin) is not inherited by the owner's other children
    # (PEP 446), so only the owner keeps the pipe open.
    return subprocess.Popen([sys.executable, "-m", "scrapy_suite.reaper", str(pid),
                             *directories], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            start_new_session=True)


def reap(pid: int, directories: list[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        while not ended(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not ended(pid):
            os.kill(pid, signal.SIGKILL)
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the owner, which ends us
    sys.stdin.buffer.read()  # until the owner's end closes
    reap(int(argv[0]), argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])

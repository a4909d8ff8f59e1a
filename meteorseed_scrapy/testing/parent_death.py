"""Servers the test rig starts die with the process that started them, even by SIGKILL.

A killed test run (a CI timeout, a developer's kill -9) runs none of its clean-up: without this
its Redis and PostgreSQL servers stay up, re-parented to init, holding ports and temporary
directories. util-linux's ``setpriv --pdeathsig`` (2.33+) asks the kernel to kill the server
when its parent goes; it execs in place, so the server's pid is the one the rig holds.

The kernel ties the signal to the *thread* that started the server, so only the main thread's
servers get it: a server started from a short-lived thread would die with that thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from functools import cache


@cache
def setpriv() -> str | None:
    """``setpriv`` when it can set a parent-death signal, else None."""
    found = shutil.which("setpriv")
    if found is None:
        return None
    try:
        probe = subprocess.run([found, "--pdeathsig", "KILL", "true"], capture_output=True,
                               timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if probe.returncode == 0 else None


def pdeathsig_options() -> list[str]:
    """``setpriv``'s options that kill the server with this process, when they can (else [])."""
    if setpriv() is None or threading.current_thread() is not threading.main_thread():
        return []
    # (set by setpriv after any change of user, which would clear it)
    return ["--pdeathsig", "KILL"]


def dying_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that it is killed when this process dies (as is, where it cannot be)."""
    options = pdeathsig_options()
    if not options:
        return argv
    return [str(setpriv()), *options, "--", *argv]


def ended(pid: int) -> bool:
    """``pid`` is gone, or a zombie (its parent ended and nobody reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    return False

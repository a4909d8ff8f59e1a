"""Start a real, throwaway PostgreSQL server on a free loopback port, as root or not.

``initdb`` and ``postgres`` refuse to run as root, and the tests (and CI's fresh Debian machine)
run as root: the data directory is then given to an unprivileged user (``nobody``, or a system
user created for this when there is none) and both programs run as that user through
``setpriv``, which execs in place, so the server's pid is the one this module holds (a kill -9
reaches the server, not a wrapper).

The binaries come from ``METEORSEED_POSTGRES_BIN`` (a directory) when set, else Debian's newest
``/usr/lib/postgresql/<version>/bin``, else ``initdb`` on ``PATH``; with none,
:class:`PostgresMissing` says so (the tests skip with that reason).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from meteorseed_scrapy.testing.parent_death import dying_with_parent, pdeathsig_options
from meteorseed_scrapy.testing.redis_server import free_port

_SYSTEM_USER = "meteorseed-pg"
USER = "postgres"  # the database superuser initdb creates (trust auth on loopback only)


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bindir() -> str:
    """The directory holding ``initdb`` and ``postgres``, or :class:`PostgresMissing`."""
    candidates = [os.environ.get("METEORSEED_POSTGRES_BIN", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda path: int(Path(path).parent.name)
                         if Path(path).parent.name.isdigit() else 0, reverse=True)
    on_path = shutil.which("initdb")
    candidates.append(os.path.dirname(on_path) if on_path else "")
    for bindir in candidates:
        if bindir and all(os.access(Path(bindir, name), os.X_OK)
                          for name in ("initdb", "postgres", "pg_isready")):
            return bindir
    raise PostgresMissing("no PostgreSQL server binaries (initdb, postgres): install Debian's "
                          "postgresql-15, or set METEORSEED_POSTGRES_BIN to their directory")


def _unprivileged_user() -> pwd.struct_passwd | None:
    """The user to run the server as: None when not root (this process's own user)."""
    if os.geteuid() != 0:
        return None
    for name in ("nobody", _SYSTEM_USER):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    _SYSTEM_USER], check=True, capture_output=True, timeout=60)
    return pwd.getpwnam(_SYSTEM_USER)


class PostgresServer:
    """``with PostgresServer() as server: server.uri()`` — stopped and removed on exit."""

    def __init__(self, *, fsync: bool = True) -> None:
        self.bindir = find_bindir()
        self.port = free_port()
        self.fsync = fsync
        self.workdir = tempfile.mkdtemp(prefix="meteorseed-postgres-")
        self.datadir = str(Path(self.workdir, "data"))
        self.user = _unprivileged_user()
        if self.user is not None:
            os.chown(self.workdir, self.user.pw_uid, self.user.pw_gid)
        self.process: subprocess.Popen[bytes] | None = None
        self._initdb()

    def _as_user(self, args: list[str]) -> list[str]:
        """``args`` run as the unprivileged user, if any, and killed when this process dies."""
        if self.user is None:
            return dying_with_parent(args)
        return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                "--clear-groups", *pdeathsig_options(), "--", *args]

    def _initdb(self) -> None:
        args = [f"{self.bindir}/initdb", "-D", self.datadir, "-U", USER, "--auth=trust",
                "-E", "UTF8", "--locale=C", "--no-sync"]
        done = subprocess.run(self._as_user(args), capture_output=True, timeout=120,
                              check=False, cwd=self.workdir)
        if done.returncode:
            raise RuntimeError(f"initdb failed: {done.stderr.decode(errors='replace')[-800:]}")

    def uri(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 30.0) -> PostgresServer:
        """Start the server and wait until it accepts connections."""
        for _ in range(5):
            log = Path(self.workdir, "postgres.log")
            args = [f"{self.bindir}/postgres", "-D", self.datadir, "-p", str(self.port),
                    "-h", "127.0.0.1", "-k", self.workdir,
                    "-c", f"fsync={'on' if self.fsync else 'off'}", "-c", "max_connections=200"]
            with open(log, "ab") as out:
                self.process = subprocess.Popen(self._as_user(args), stdout=out, stderr=out,
                                                cwd=self.workdir)
            if self._wait_ready(timeout):
                return self
            text = log.read_text(errors="replace")
            if "could not bind" in text or "Address already in use" in text:
                log.unlink()
                self.port = free_port()  # taken meanwhile by another test's server
                continue
            raise RuntimeError(f"postgres did not start: {text[-800:]}")
        raise RuntimeError("postgres: no free port found")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                self.process = None
                return False
            ready = subprocess.run(
                [f"{self.bindir}/pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port),
                 "-U", USER, "-t", "1"], check=False, timeout=30)
            if ready.returncode == 0:
                return True
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"postgres did not accept connections within {timeout} s")

    def create_database(self, name: str) -> str:
        """A new, empty database on this server; its URI."""
        import psycopg  # (only where a PostgreSQL store is tested: the "postgres" extra)

        with psycopg.connect(self.uri(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.uri(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT): open transactions are rolled back, clients disconnected."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A started server for a test session, or the test skipped with the reason there is none
    (no PostgreSQL binaries, or no psycopg: the ``postgres`` extra)."""
    import pytest

    try:
        import psycopg  # noqa: F401
        server = PostgresServer()
    except (ImportError, PostgresMissing) as exc:
        pytest.skip(f"no PostgreSQL to test against: {exc}")
    with server:
        yield server


__all__ = ["PostgresMissing", "PostgresServer", "find_bindir", "running_postgres"]

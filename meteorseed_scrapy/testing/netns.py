"""Simulated hosts for fleet tests: Linux network namespaces on two private test bridges.

``with Fleet(workers=2) as fleet:`` makes a namespace for Redis, one for the test site and one per
worker (``w1``, ``w2``...). Two bridges in the root namespace join them, each a /24 of the test
range 10.213.0.0/16 that the fleet picks free, creates and deletes itself:

* *back*: Redis and the workers (the root namespace, where the test runs, is ``.1``);
* *front*: the site and the workers.

Namespaces get no default route, so nothing in them reaches any address but these. A host is
partitioned by taking its bridge port down (:meth:`Fleet.cut`): its packets are then dropped
silently, as on a real network, not refused; :meth:`Fleet.heal` brings it back. Everything
(processes in the namespaces, namespaces, links) goes on exit, on failure too, and at interpreter
exit; a new fleet first removes what a dead process's fleet left behind. Needs root (or
CAP_NET_ADMIN): :func:`unavailable` says why a fleet cannot be built here.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import find_redis_server

TEST_RANGE = ipaddress.ip_network("10.213.0.0/16")
REDIS_PORT = 6379
SITE_PORT = 8000
_NS_RE = re.compile(r"^msf(\d+)-")
_LINK_RE = re.compile(r"^mf(\d+)[bf]\d*$")


def _ip(*args: str, ns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why network namespaces cannot be built here (None: they can)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, not {sys.platform}"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"msf{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except (RuntimeError, OSError) as exc:
        return f"cannot create a network namespace (root / CAP_NET_ADMIN needed): {exc}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_ns_processes(ns: str) -> None:
    """End the processes this fleet started in ``ns`` (by their ids), then wait for them."""
    pids = [int(p) for p in _ip("netns", "pids", ns, check=False).split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _ip("netns", "pids", ns, check=False).split(), timeout=10)


def remove_stale() -> None:
    """Remove the namespaces and links of fleets whose process is gone."""
    for line in _ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        found = _NS_RE.match(name)
        if found and not _alive(int(found.group(1))):
            _kill_ns_processes(name)
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        found = _LINK_RE.match(name)
        if found and not _alive(int(found.group(1))):
            _ip("link", "del", name, check=False)


def _free_subnets() -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    used = {ipaddress.ip_interface(a).network for a in re.findall(
        r"inet (\S+)", _ip("-4", "-o", "addr", "show"))}
    nets = [ipaddress.IPv4Network(n) for n in TEST_RANGE.subnets(new_prefix=24)]
    start = (os.getpid() % 100) * 2 + 2
    for i in range(len(nets) // 2):
        k = (start + 2 * i) % (len(nets) - 2)
        back, front = nets[k], nets[k + 1]
        if not used & {back, front}:
            return back, front
    raise RuntimeError(f"no free pair of /24s left in {TEST_RANGE}")


@dataclass
class Host:
    name: str
    ns: str
    back: str | None  # its address on the back bridge (Redis side), if attached
    front: str | None  # on the front bridge (site side)


class Fleet:
    """Namespaces ``redis``, ``site`` and ``w1``..``wN`` on two test bridges (see module doc)."""

    def __init__(self, workers: int, workdir: str | None = None) -> None:
        self.tag = f"{os.getpid()}"
        self.workers = [f"w{i}" for i in range(1, workers + 1)]
        self.hosts: dict[str, Host] = {}
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="meteorseed-fleet-"))
        self._procs: list[subprocess.Popen[bytes]] = []
        self._links: list[str] = []
        self._closed = False

    # -- building and tearing down ---------------------------------------------------------
    def __enter__(self) -> Fleet:
        remove_stale()
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _bridge(self, side: str, net: ipaddress.IPv4Network) -> str:
        name = f"mf{self.tag}{side}"
        _ip("link", "add", name, "type", "bridge")
        self._links.append(name)
        _ip("addr", "add", f"{net[1]}/{net.prefixlen}", "dev", name)
        _ip("link", "set", name, "up")
        return name

    def _attach(self, host: Host, index: int, side: str, bridge: str, address: str,
                net: ipaddress.IPv4Network) -> None:
        outer, inner = f"mf{self.tag}{side}{index}", f"mf{self.tag}p{index}"
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        self._links.append(outer)
        _ip("link", "set", inner, "netns", host.ns)
        _ip("link", "set", inner, "name", side + "0", ns=host.ns)
        _ip("addr", "add", f"{address}/{net.prefixlen}", "dev", side + "0", ns=host.ns)
        _ip("link", "set", side + "0", "up", ns=host.ns)
        _ip("link", "set", outer, "master", bridge)
        _ip("link", "set", outer, "up")

    def _build(self) -> None:
        back_net, front_net = _free_subnets()
        self.back_gateway, self.front_gateway = str(back_net[1]), str(front_net[1])
        back, front = self._bridge("b", back_net), self._bridge("f", front_net)
        plan = [("redis", True, False), ("site", False, True),
                *((w, True, True) for w in self.workers)]
        for index, (name, on_back, on_front) in enumerate(plan, start=2):
            host = Host(name, f"msf{self.tag}-{name}", str(back_net[index]) if on_back else None,
                        str(front_net[index]) if on_front else None)
            _ip("netns", "add", host.ns)
            self.hosts[name] = host
            _ip("link", "set", "lo", "up", ns=host.ns)
            if host.back:
                self._attach(host, index, "b", back, host.back, back_net)
            if host.front:
                self._attach(host, index, "f", front, host.front, front_net)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for host in self.hosts.values():
            _kill_ns_processes(host.ns)
            _ip("netns", "del", host.ns, check=False)
        for link in self._links:
            _ip("link", "del", link, check=False)
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.close)

    # -- processes -------------------------------------------------------------------------
    def spawn(self, host: str, argv: Sequence[str], *, log: Path | None = None,
              env: dict[str, str] | None = None, cwd: str | Path | None = None
              ) -> subprocess.Popen[bytes]:
        """Run ``argv`` inside ``host``'s namespace; ended with the fleet."""
        out: IO[bytes] | int = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[host].ns, *argv],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        finally:
            if not isinstance(out, int):
                out.close()
        self._procs.append(proc)
        return proc

    def start_redis(self) -> str:
        """redis-server in the ``redis`` host, bound to its address; returns its URL."""
        address = self.hosts["redis"].back
        assert address is not None
        self.spawn("redis", [find_redis_server(), "--port", str(REDIS_PORT), "--bind", address,
                             "--protected-mode", "no", "--save", "", "--appendonly", "no",
                             "--dir", str(self.workdir)], log=self.workdir / "redis.log")
        wait_for(lambda: _answers(address, REDIS_PORT), timeout=15)
        return f"redis://{address}:{REDIS_PORT}/0"

    def start_site(self) -> str:
        """The demo site, measuring what it serves (:mod:`.metered_site`), in the ``site``
        host; returns its base URL."""
        address = self.hosts["site"].front
        assert address is not None
        self.spawn("site", [sys.executable, "-m", "meteorseed_scrapy.testing.metered_site",
                            "--host", address, "--port", str(SITE_PORT)],
                   log=self.workdir / "site.log")
        wait_for(lambda: _answers(address, SITE_PORT), timeout=15)
        return f"http://{address}:{SITE_PORT}"

    # -- partitions ------------------------------------------------------------------------
    def _ports(self, host: str, side: str) -> list[str]:
        index = list(self.hosts).index(host) + 2
        h = self.hosts[host]
        sides = {"back": ["b"] if h.back else [], "front": ["f"] if h.front else []}
        chosen = sides["back"] + sides["front"] if side == "all" else sides[side]
        if not chosen:
            raise ValueError(f"host {host!r} has no {side} link")
        return [f"mf{self.tag}{s}{index}" for s in chosen]

    def cut(self, host: str, side: str = "all") -> None:
        """Partition ``host`` from its ``back`` bridge, ``front`` bridge or ``all``."""
        for port in self._ports(host, side):
            _ip("link", "set", port, "down")

    def heal(self, host: str, side: str = "all") -> None:
        for port in self._ports(host, side):
            _ip("link", "set", port, "up")


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False

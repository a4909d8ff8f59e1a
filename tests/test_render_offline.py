"""A render worker's browser looks up no host name of its own: rendering a loopback page, the
system's Chromium with the launch options ``BrowserHandler`` gives it asks no DNS server anything.

The probe runs in a network namespace of its own (``unshare -n``): the resolver's addresses from
``/etc/resolv.conf`` are put on its loopback, where a small DNS server notes every name asked
and answers "no such name". Chromium asks for its sign-in host only on a host it thinks is
online, so the namespace also gets a veth pair with its default route: both ends stay in the
namespace, joined to nothing else, so nothing can leave the machine, whatever Chromium tries.
A name looked up by ``getent`` first proves the notes are taken.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meteorseed_scrapy.sites import render
from tests.subprocess_env import python_path

ROOT = Path(__file__).resolve().parents[1]
RIG_CHECK = "rig-check.invalid"
#: How long the browser is watched once the page is in: without QUIET_ARGS, Debian's Chromium
#: asked for update.googleapis.com and accounts.google.com 18 to 27 times in 10 s; Chromium 150
#: without the GCM switches, android.clients.google.com 6 times.
WATCH_S = 10


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "no unshare or ip (util-linux, iproute2)"
    done = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    return None if done.returncode == 0 else "cannot make a network namespace (not root?)"


PROBE = r'''
import asyncio, json, socket, subprocess, sys, threading, http.server

servers = [line.split()[1] for line in open("/etc/resolv.conf")
           if line.startswith("nameserver") and ":" not in line.split()[1]] or ["127.0.0.1"]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
for address in servers:
    if not address.startswith("127."):
        subprocess.run(["ip", "addr", "add", address + "/32", "dev", "lo"], check=True)
for command in ("link add msq0 type veth peer name msq1", "addr add 10.213.255.2/24 dev msq0",
                "link set msq0 up", "link set msq1 up", "route add default dev msq0"):
    subprocess.run(["ip", *command.split()], check=True)
asked = []


def answer(sock):
    while True:
        data, peer = sock.recvfrom(4096)
        at, labels = 12, []
        while at < len(data) and data[at]:
            labels.append(data[at + 1:at + 1 + data[at]].decode(errors="replace"))
            at += 1 + data[at]
        asked.append(".".join(labels))
        # the question back, flagged as an answer: NXDOMAIN, no records
        sock.sendto(data[:2] + b"\x81\x83" + data[4:6] + bytes(6) + data[12:at + 5], peer)


for address in servers:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    threading.Thread(target=answer, args=(sock,), daemon=True).start()
subprocess.run(["getent", "hosts", sys.argv[1]], check=False)
site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=site.serve_forever, daemon=True).start()

from scrapy.utils.reactor import install_reactor
install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
from scrapy.utils.test import get_crawler
from meteorseed_scrapy.sites.browser import BrowserHandler
from meteorseed_scrapy.sites.spider import RuleSpider
from playwright.async_api import async_playwright

handler = BrowserHandler(get_crawler(RuleSpider, {"METEORSEED_CHROMIUM_PATH": sys.argv[2]}))
options = handler.config.launch_options


async def main():
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(**options)
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{site.server_port}/")
        await asyncio.sleep(float(sys.argv[3]))  # (watched for what it does meanwhile)
        await browser.close()


asyncio.run(main())
print(json.dumps({"asked": asked, "args": options["args"],
                  "executable_path": options["executable_path"]}))
'''


@pytest.mark.skipif(render.chromium_missing(render.DEFAULT_CHROMIUM) is not None
                    or not render.PLAYWRIGHT_INSTALLED,
                    reason="no system Chromium or no scrapy-playwright")
def test_the_render_browser_looks_up_no_host_name() -> None:
    problem = _can_unshare()
    if problem:
        pytest.skip(problem)
    proc = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", PROBE, RIG_CHECK, render.DEFAULT_CHROMIUM,
         str(WATCH_S)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        # (not the tests' tests/offline_chromium, set by conftest, which resolves no name)
        env={**{k: v for k, v in os.environ.items() if k != "METEORSEED_CHROMIUM_PATH"},
             "PYTHONPATH": python_path(ROOT, os.environ.get("PYTHONPATH", ""))})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["executable_path"] == render.DEFAULT_CHROMIUM
    assert set(render.QUIET_ARGS) <= set(found["args"])
    assert found["asked"][:1] == [RIG_CHECK], found  # (the notes are taken)
    assert [name for name in found["asked"] if name != RIG_CHECK] == []

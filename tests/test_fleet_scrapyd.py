"""A rolling deploy through scrapyd on three simulated hosts (network namespaces).

One scrapyd per worker host, each bound to its host's address; the probe project
(tests/e2e_project) deployed to each with ``scrapyd-deploy``; a crawl running on all three when
a new egg version is deployed and each host's job is restarted in turn (``cancel.json``, then
``schedule.json``, which runs the newest version). Skipped where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.metered_site import meter
from meteorseed_scrapy.testing.netns import Fleet, unavailable
from meteorseed_scrapy.testing.polling import wait_for
from tests.e2e_helpers import PROJECT, enqueue, stored_docs

_WHY = unavailable()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(_WHY is not None, reason=_WHY or "")]

NS = "rolling"
PORT = 6800
# The longest the site may go without a request. Alone on 2 cores the longest pause is about
# 1 s (a wave of 1 s pages); with a second whole suite running beside it, 3.2 s once, the
# workers starved of CPU. A fleet held up by a restarting host would be quiet for as long as
# its stop deadline (15 s) or a lease or claim lapse (30 s here): still caught.
MAX_QUIET_S = 6.0


class HostScrapyd:
    """scrapyd inside a fleet host's namespace, on its back-bridge address."""

    def __init__(self, fleet: Fleet, host: str) -> None:
        self.host = host
        self.home = fleet.workdir / f"scrapyd-{host}"
        self.home.mkdir()
        address = fleet.hosts[host].back
        self.url = f"http://{address}:{PORT}/"
        (self.home / "scrapyd.conf").write_text(
            f"[scrapyd]\nbind_address = {address}\nhttp_port = {PORT}\n"
            f"eggs_dir = {self.home / 'eggs'}\nlogs_dir = {self.home / 'logs'}\n"
            f"dbs_dir = {self.home / 'dbs'}\nitems_dir =\nmax_proc = 2\npoll_interval = 0.2\n",
            encoding="utf-8")
        env = dict(os.environ)
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        fleet.spawn(host, [sys.executable, "-m", "scrapyd", "--pidfile=", "-l",
                           str(self.home / "scrapyd.log")], env=env, cwd=self.home)
        wait_for(self._up, 60, 0.2)

    def _up(self) -> bool:
        try:
            return self.call("daemonstatus.json")["status"] == "ok"
        except OSError:
            return False

    def call(self, endpoint: str, fields: list[tuple[str, str]] | None = None,
             **params: str) -> dict[str, Any]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        body = urllib.parse.urlencode(fields).encode() if fields is not None else None
        with urllib.request.urlopen(f"{self.url}{endpoint}{query}", body, timeout=30) as reply:
            data: dict[str, Any] = json.loads(reply.read())
        return data

    def schedule(self, settings: dict[str, Any]) -> str:
        fields = [("project", "probe"), ("spider", "probe")]
        fields += [("setting", f"{k}={v}") for k, v in settings.items()]
        reply = self.call("schedule.json", fields)
        assert reply["status"] == "ok", reply
        return str(reply["jobid"])

    def state(self, job: str) -> str:
        jobs = self.call("listjobs.json", project="probe")
        for state in ("pending", "running", "finished"):
            if any(j["id"] == job for j in jobs[state]):
                return state
        return "unknown"

    def job_log(self, job: str) -> str:
        path = self.home / "logs" / "probe" / "probe" / f"{job}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _deploy(project: Path, scrapyd: HostScrapyd, version: str) -> None:
    env = dict(os.environ, SCRAPYD_URL=scrapyd.url)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    done = subprocess.run([str(Path(sys.executable).with_name("scrapyd-deploy")), "fleet", "-v",
                           version], cwd=project, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout
    versions = scrapyd.call("listversions.json", project="probe")["versions"]
    assert version in versions, versions


def test_rolling_deploy_restarts_each_host_and_loses_nothing(tmp_path: Path) -> None:
    project = tmp_path / "project"  # scrapyd-deploy writes build files next to scrapy.cfg
    shutil.copytree(PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    with open(project / "scrapy.cfg", "a", encoding="utf-8") as cfg:
        cfg.write("\n[deploy:fleet]\nurl = ${SCRAPYD_URL}\nproject = probe\n")
    with Fleet(workers=3) as fleet:
        redis_url, site = fleet.start_redis(), fleet.start_site()
        keys, store = KeyLayout(NS), fleet.workdir / "items.db"
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        hosts = [HostScrapyd(fleet, w) for w in fleet.workers]
        for scrapyd in hosts:
            _deploy(project, scrapyd, "v1")
        tasks = enqueue(redis_url, NS, [f"{site}/slow/1000?i={i}" for i in range(600)])
        common = {"METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": NS,
                  "METEORSEED_STORE_URI": f"sqlite:///{store}", "METEORSEED_CLAIM_IDLE": 30,
                  "METEORSEED_IDLE_CLOSE": 3, "CONCURRENT_REQUESTS": 4}
        jobs = {s.host: s.schedule({**common, "METEORSEED_CONSUMER": f"{s.host}-v1"})
                for s in hosts}
        wait_for(lambda: len(stored_docs(store)) >= 12, 120)
        # v2 says so in each job's first log line ("started (bot: probe-v2)").
        settings = project / "probe" / "settings.py"
        settings.write_text(settings.read_text().replace('BOT_NAME = "probe"',
                                                         'BOT_NAME = "probe-v2"'))
        for scrapyd in hosts:
            _deploy(project, scrapyd, "v2")
        restarted = []
        for scrapyd in hosts:  # one host at a time
            old = jobs[scrapyd.host]
            reply = scrapyd.call("cancel.json", [("project", "probe"), ("job", old)])
            assert reply["prevstate"] == "running", reply
            wait_for(lambda: scrapyd.state(old) == "finished", 90, 0.2)  # noqa: B023
            log = scrapyd.job_log(old)
            assert "Closing spider (shutdown)" in log and "Traceback" not in log, log[-3000:]
            assert r.xlen(keys.stream) > 0, "the crawl must still run while hosts restart"
            jobs[scrapyd.host] = scrapyd.schedule({**common,
                                                   "METEORSEED_CONSUMER": f"{scrapyd.host}-v2"})
            restarted.append(scrapyd.host)
        for scrapyd in hosts:
            wait_for(lambda: scrapyd.state(jobs[scrapyd.host]) == "finished", 240, 0.5)  # noqa: B023
            log = scrapyd.job_log(jobs[scrapyd.host])
            assert "Closing spider (finished)" in log, log[-3000:]
            assert "(bot: probe-v2)" in log, log[:2000]
        measures = meter(site)
        docs = stored_docs(store)
        stored = [d["task_id"] for d in docs.values()]
        figures = {"lost": len({t.task_id for t in tasks} - set(stored)),
                   "duplicates": len(stored) - len(set(stored)),
                   "pending": int(r.xpending(keys.stream, keys.group)["pending"]),
                   "dead": int(r.xlen(keys.dead))}
        assert figures == {"lost": 0, "duplicates": 0, "pending": 0, "dead": 0}, figures
        assert r.xlen(keys.stream) == 0
        # Two hosts always crawl while the third restarts: the site never goes quiet for
        # longer than a few of its 1 s pages.
        assert measures["max_gap"] < MAX_QUIET_S, measures
        assert measures["requests"] == len(tasks), "each page fetched once, across restarts"
        print(f"rolling restart of {restarted}: {figures}; site requests {measures['requests']} "
              f"for {len(tasks)} tasks, longest pause {measures['max_gap']:.2f}s")

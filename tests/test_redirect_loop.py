"""A redirect loop (or a chain longer than REDIRECT_MAX_TIMES) ends its task as ``ignored``
with one WARNING naming the URL and the redirect count, and the reason in its completion
record (issue 22: it ended ``ignored`` with no log line naming the URL)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from twisted.python.failure import Failure

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.settling import REDIRECTS_STAT as STAT
from meteorseed_scrapy.worker.settling import too_many_redirects
from tests.e2e_helpers import add_tasks, start_worker


class Redirecting(http.server.BaseHTTPRequestHandler):
    """``/loop`` redirects to itself; ``/chain/<n>`` to ``/chain/<n+1>``; ``/refresh`` is a
    page whose meta refresh leads to itself."""

    def do_GET(self) -> None:
        if self.path == "/refresh":
            body = b'<html><head><meta http-equiv="refresh" content="0;url=/refresh"></head></html>'
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path.startswith("/chain/"):
            to = f"/chain/{int(self.path.rsplit('/', 1)[1]) + 1}"
        else:
            to = "/loop"
        self.send_response(302)
        self.send_header("Location", to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def ended(url: str, **meta: Any) -> Request:
    return Request(url, meta=meta)


def test_only_a_request_discarded_after_its_redirects_is_too_many() -> None:
    ignored = Failure(IgnoreRequest("max redirections reached"))
    loop = ended("https://a.test/x", redirect_times=3,
                 redirect_urls=["https://a.test/x", "https://a.test/y", "https://a.test/x"])
    assert too_many_redirects(loop, ignored, 3) == (
        "https://a.test/x redirected 3 times, a loop (back to https://a.test/x): more than"
        " REDIRECT_MAX_TIMES allows")
    chain = ended("https://a.test/3", redirect_times=3,
                  redirect_urls=["https://a.test/0", "https://a.test/1", "https://a.test/2"])
    assert "a chain ending at https://a.test/3" in too_many_redirects(chain, ignored, 3)
    # a request's own redirect_ttl ran out before REDIRECT_MAX_TIMES
    short = ended("https://a.test/1", redirect_times=1, redirect_ttl=0,
                  redirect_urls=["https://a.test/0"])
    assert "redirected 1 times" in too_many_redirects(short, ignored, 20)
    # not too many: fewer redirects, no redirect, another ending
    assert too_many_redirects(ended("https://a.test/", redirect_times=2, redirect_ttl=1),
                              ignored, 3) == ""
    assert too_many_redirects(ended("https://a.test/"), ignored, 3) == ""
    assert too_many_redirects(loop, Failure(ValueError("x")), 3) == ""
    assert too_many_redirects(loop, Response("https://a.test/x"), 3) == ""


@pytest.mark.parametrize(("path", "shape"), [("/loop", "a loop (back to {site}/loop)"),
                                             ("/chain/0", "a chain ending at {site}/chain/4"),
                                             ("/refresh", "a loop (back to {site}/refresh)")])
def test_a_redirect_loop_is_ignored_with_one_warning_and_its_reason_recorded(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any, site: str,
        path: str, shape: str) -> None:
    [task] = add_tasks(redis_url, namespace, [
        ExecTask.create(seed_id="s", site_id="probe", url=site + path)])
    worker = start_worker(tmp_path, redis_url, namespace, REDIRECT_MAX_TIMES=4)
    assert worker.wait() == 0, worker.log()[-3000:]
    reason = (f"{site}{path} redirected 4 times, {shape.format(site=site)}: more than"
              " REDIRECT_MAX_TIMES allows")
    lines = [line for line in worker.log().splitlines() if "redirected" in line]
    assert len(lines) == 1 and "WARNING" in lines[0], lines
    assert lines[0].endswith(f"Task {task.task_id} ignored: {reason}")
    assert worker.stats()[STAT] == 1
    record = json.loads(sync_redis.get(KeyLayout(namespace).for_site("probe").done(
        task.task_id)))
    assert (record["outcome"], record["reason"]) == ("ignored", f"ignored: {reason}")

"""Worker-side address policy: tasks that came through the API (and their redirects) are
fetched from public addresses only, unless METEORSEED_FETCH_PRIVATE_ADDRESSES; the API
refuses literal private URLs outright and marks the seeds it accepts."""

from __future__ import annotations

import asyncio
import http.server
import threading
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.downloadermiddlewares.redirect import RedirectMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.address_policy import STAT, AddressPolicyMiddleware
from meteorseed_scrapy.seeding.addresses import POLICY_META_KEY, PRIVATE_SETTING, PUBLIC_ONLY
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.sites import DemoSite
from tests.api_helpers import ApiServer, Client
from tests.e2e_helpers import add_tasks, start_worker, stored_docs

MARKED = {POLICY_META_KEY: PUBLIC_ONLY}
DNS = {"public.example": "93.184.216.34", "inner.example": "10.1.2.3",
       "metadata.example": "169.254.169.254", "v6.example": "::1"}


async def fake_resolve(host: str) -> str:
    if host not in DNS:
        raise OSError(f"no such host {host}")
    return DNS[host]


def middleware(**settings: Any) -> AddressPolicyMiddleware:
    crawler = get_crawler(Spider, settings)
    crawler.stats.open_spider()  # type: ignore[union-attr]
    made = AddressPolicyMiddleware.from_crawler(crawler)
    made.resolve = fake_resolve
    return made


def refusal(mw: AddressPolicyMiddleware, request: Request) -> str | None:
    try:
        asyncio.run(mw.process_request(request))
    except IgnoreRequest as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(("url", "problem"), [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
    ("http://127.0.0.1:6379/", "127.0.0.1 is a loopback address"),
    ("http://[::1]:8080/", "::1 is a loopback address"),
    ("http://[::ffff:10.0.0.1]/", "::ffff:10.0.0.1 (10.0.0.1) is a private address"),
    ("http://0.0.0.0/", "0.0.0.0 is an unspecified address"),
    ("http://inner.example/admin", "inner.example (10.1.2.3) is a private address"),
    ("http://metadata.example/", "metadata.example (169.254.169.254) is a link-local address"),
    ("http://v6.example/", "v6.example (::1) is a loopback address"),
    ("http://nowhere.example/", "'nowhere.example' cannot be resolved (no such host"),
    ("file:///etc/passwd", "the file: scheme is not fetched"),
    ("data:text/html,x", "the data: scheme is not fetched"),
    ("ftp://public.example/x", "the ftp: scheme is not fetched"),
])
def test_an_api_task_to_a_non_public_address_is_refused_naming_it(url: str, problem: str
                                                                     ) -> None:
    mw = middleware()
    reason = refusal(mw, Request(url, meta=MARKED))
    assert reason is not None and reason.startswith(f"refused {url}: {problem}")
    if "scheme" in problem:  # (not HTTP(S): refused whatever the switch says)
        assert refusal(middleware(**{PRIVATE_SETTING: True}), Request(url, meta=MARKED)) \
            == reason
    else:
        assert f"set {PRIVATE_SETTING} to allow" in reason
    assert mw.crawler.stats.get_value(STAT) == 1  # type: ignore[union-attr]


def test_public_addresses_unmarked_requests_and_an_allowing_operator_pass() -> None:
    assert refusal(middleware(), Request("http://public.example/", meta=MARKED)) is None
    # the spider's own and seed-expand's requests: the operator's choice
    assert refusal(middleware(), Request("http://127.0.0.1/")) is None
    allowing = middleware(**{PRIVATE_SETTING: True})
    assert refusal(allowing, Request("http://127.0.0.1/", meta=MARKED)) is None


def test_a_redirect_to_an_internal_address_is_refused() -> None:
    """Scrapy's RedirectMiddleware builds a new request that keeps the meta: it passes the
    policy again, with the address it now leads to."""
    crawler = get_crawler(Spider)
    redirects = RedirectMiddleware.from_crawler(crawler)
    mw = middleware()
    first = Request("http://public.example/go", meta=dict(MARKED))
    assert refusal(mw, first) is None
    response = Response(first.url, status=302, request=first,
                        headers={"Location": "http://metadata.example/latest/"})
    hop = redirects.process_response(first, response)
    assert isinstance(hop, Request) and hop.url == "http://metadata.example/latest/"
    reason = refusal(mw, hop)
    assert reason is not None and "metadata.example (169.254.169.254) is a link-local" in reason


def test_the_api_refuses_literal_private_urls_and_marks_what_it_accepts(
        api_server: ApiServer, namespace: str, sync_redis: Any) -> None:
    with api_server(token=None) as server:
        api = Client(server.url, None)
        status, _, body = api.call("POST", "/dispatch", {"seeds": [
            {"seed_id": "m", "site_id": "s", "task_type": "url_list",
             "payload": {"urls": ["https://ok.example/", "http://169.254.169.254/latest/"]}},
            {"seed_id": "r", "site_id": "s", "task_type": "url_list",
             "payload": {"urls": ["http://127.0.0.1:6379/"]}}]})
        assert status == 422
        assert [(e["field"], e["problem"].split(";")[0]) for e in body["errors"]] == [
            ("seeds[0].payload.urls[1]", "refused: 169.254.169.254 is a link-local address"),
            ("seeds[1].payload.urls[0]", "refused: 127.0.0.1 is a loopback address")]
        status, _, body = api.call("POST", "/dispatch", {
            "seed_id": "ok", "site_id": "s", "task_type": "url_list",
            "payload": {"urls": ["https://ok.example/"]}})
        assert status == 202 and body["enqueued"] == 1
    tasks = [ExecTask.from_message(fields)
             for key in sync_redis.scan_iter(f"{namespace}:*")
             if sync_redis.type(key) == "stream"
             for _, fields in sync_redis.xrange(key) if "t" in fields]
    assert [(t.url, t.meta.get(POLICY_META_KEY)) for t in tasks] == [
        ("https://ok.example/", PUBLIC_ONLY)]


@pytest.mark.parametrize("allow", [False, True])
def test_a_worker_refuses_api_tasks_to_loopback_unless_allowed(
        tmp_path: Path, redis_url: str, namespace: str, allow: bool) -> None:
    """End to end, real DNS: ``localhost`` resolves to loopback through the reactor's
    resolver; an unmarked task (the operator's) is fetched either way."""
    with DemoSite(sections=("test",)) as site:
        port = site.url.rsplit(":", 1)[1]
        add_tasks(redis_url, namespace, [
            ExecTask.create(seed_id="api", site_id="probe", meta=MARKED,
                            url=f"http://localhost:{port}/status/200?api=name"),
            ExecTask.create(seed_id="api", site_id="probe", meta=MARKED,
                            url=f"http://127.0.0.1:{port}/status/200?api=literal"),
            ExecTask.create(seed_id="own", site_id="probe",
                            url=f"http://127.0.0.1:{port}/status/200?own=1")])
        settings = {PRIVATE_SETTING: True} if allow else {}
        worker = start_worker(tmp_path, redis_url, namespace, **settings)
        assert worker.wait() == 0, worker.log()[-3000:]
        assert site.hits("/status/200") == (3 if allow else 1)
    log = worker.log()
    if allow:
        assert "Address policy" not in log
    else:
        assert f"Address policy: refused http://localhost:{port}/status/200?api=name: " \
               "localhost (127.0.0.1) is a loopback address" in log
        assert f"refused http://127.0.0.1:{port}/status/200?api=literal: 127.0.0.1 is a " \
               "loopback address" in log


class Proxy(http.server.BaseHTTPRequestHandler):
    """A forward proxy that answers every request itself: ``public.test``'s page links to
    loopback; every URL asked for is noted."""

    asked: list[str] = []
    link = ""

    def do_GET(self) -> None:
        self.asked.append(self.path)
        body = f'<html><title>t</title><a href="{self.link}">in</a></html>'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_link_on_an_api_task_s_page_keeps_the_mark_and_loopback_is_not_fetched(
        tmp_path: Path, redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: the API task's page (a public host, served through a local proxy) links
    to 127.0.0.1; the child request carries the mark and is refused before any download.
    (A ``file:`` link is no task at all: refused when yielded, ``task/validation.py``.)"""
    link, problem = "http://127.0.0.1:6379/secret", "127.0.0.1 is a loopback address"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Proxy.asked = []
    Proxy.link = link
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        add_tasks(redis_url, namespace, [ExecTask.create(
            seed_id="api", site_id="probe", meta=MARKED, url="http://www.public.test/page")])
        worker = start_worker(tmp_path, redis_url, namespace, spider_args={"follow": "1"},
                              DNS_RESOLVER="probe.public_names.PublicTestNames")
        assert worker.wait() == 0, worker.log()[-3000:]
    finally:
        server.shutdown()
        server.server_close()
    assert Proxy.asked == ["http://www.public.test/page"]
    assert f"Address policy: refused {link}: {problem}" in worker.log()
    assert worker.stats()[STAT] == 1
    assert [doc["url"] for doc in stored_docs(tmp_path / "items.db").values()] == [
        "http://www.public.test/page"]

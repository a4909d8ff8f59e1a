"""Per-site hygiene: blacklist, robots.txt, User-Agent pool, proxy pool, cookie warm-up."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.addon import MeteorSeedAddon
from meteorseed_scrapy.politeness.blacklist import BlacklistMiddleware
from meteorseed_scrapy.politeness.proxies import ProxyPool, ProxyPoolMiddleware
from meteorseed_scrapy.politeness.user_agents import UserAgentPoolMiddleware
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.sites.lookup import site_config
from meteorseed_scrapy.task.context import TASK_META_KEY
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.loopback import LoopbackSite
from meteorseed_scrapy.testing.polling import wait_for
from tests.e2e_helpers import enqueue, start_worker, stored_docs

SITE = """site_id: {site_id}
version: "1"
start: detail
fields:
  title: {{css: "title::text"}}
{extra}
"""


def write_site(directory: Path, site_id: str, extra: str = "") -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"{site_id}.yaml"
    path.write_text(SITE.format(site_id=site_id, extra=extra))
    return directory


# -- a recording site (and HTTP proxy stub) ------------------------------------------------------


class RecordingSite(LoopbackSite):
    """Answers every GET with a small page; records (target, User-Agent, Cookie). Absolute-URI
    targets (``GET http://host/path``) are what a client sends to an HTTP proxy: served too,
    so one instance is also a working proxy. ``/robots.txt`` disallows ``/private``."""

    thread_name = "recording-site"

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, str]] = []

    def paths(self) -> list[str]:
        with self.lock:
            return [urlsplit(t).path for t, _, _ in self.seen]


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    site: RecordingSite

    def do_GET(self) -> None:
        with self.site.lock:
            self.site.seen.append((self.path, self.headers.get("User-Agent", ""),
                                   self.headers.get("Cookie", "")))
        path = urlsplit(self.path).path
        extra: dict[str, str] = {}
        if path == "/robots.txt":
            ctype, body = "text/plain", b"User-agent: *\nDisallow: /private\n"
        else:
            ctype, body = "text/html", f"<html><title>{path}</title></html>".encode()
            if path == "/":
                extra["Set-Cookie"] = "session=warm; Path=/"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


RecordingSite.handler = _Recorder


@pytest.fixture
def site() -> Iterator[RecordingSite]:
    with RecordingSite() as s:
        yield s


def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()
    return port


# -- unit tests ---------------------------------------------------------------------------------


def task_request(url: str, site_id: str, **kwargs: Any) -> Request:
    task = ExecTask.create(seed_id="s", site_id=site_id, url=url)
    return Request(url, meta={TASK_META_KEY: task}, **kwargs)


def crawler_for(sites_dir: Path, **settings: Any) -> Any:
    return get_crawler(settings_dict={"METEORSEED_SITES_DIR": str(sites_dir), **settings})


def test_addon_obeys_robots_by_default_and_a_project_may_switch_it_off() -> None:
    settings = Settings({"DOWNLOADER_MIDDLEWARES": {}, "ITEM_PIPELINES": {}})
    MeteorSeedAddon().update_settings(settings)
    assert settings.getbool("ROBOTSTXT_OBEY") is True
    blacklist = "meteorseed_scrapy.politeness.blacklist.BlacklistMiddleware"
    assert load_object(blacklist) in map(load_object, settings.getdict("DOWNLOADER_MIDDLEWARES"))
    project = Settings({"DOWNLOADER_MIDDLEWARES": {}, "ITEM_PIPELINES": {}})
    project.set("ROBOTSTXT_OBEY", False, priority="project")
    MeteorSeedAddon().update_settings(project)
    assert project.getbool("ROBOTSTXT_OBEY") is False


def test_blacklisted_url_is_ignored_naming_the_pattern(tmp_path: Path) -> None:
    sites = write_site(tmp_path / "sites", "bl", 'blacklist: ["/logout", "\\\\?sort="]\n'
                                                  "robots: false")
    crawler = crawler_for(sites)
    crawler.stats.open_spider()
    mw = BlacklistMiddleware.from_crawler(crawler)
    ok = task_request("http://x.test/page", "bl")
    assert mw.process_request(ok) is None
    assert ok.meta["dont_obey_robotstxt"] is True  # robots: false in the site config
    with pytest.raises(IgnoreRequest, match="pattern '/logout'"):
        mw.process_request(task_request("http://x.test/logout", "bl"))
    with pytest.raises(IgnoreRequest, match="sort="):
        mw.process_request(task_request("http://x.test/list?sort=asc", "bl"))
    assert crawler.stats.get_value("meteorseed/blacklisted/bl") == 2
    # Unknown sites and requests without a task pass untouched.
    mw.process_request(task_request("http://x.test/logout", "other"))
    mw.process_request(Request("http://x.test/logout"))


def test_user_agent_pool_round_robin_and_explicit_agent_kept(tmp_path: Path) -> None:
    sites = write_site(tmp_path / "sites", "ua",
                       'user_agents: ["UA-one", "UA-two"]\nheaders: {Accept-Language: de}')
    mw = UserAgentPoolMiddleware.from_crawler(crawler_for(sites))
    agents = []
    for _ in range(4):
        request = task_request("http://x.test/", "ua")
        mw.process_request(request)
        agents.append(request.headers[b"User-Agent"].decode())
        assert request.headers[b"Accept-Language"] == b"de"
    assert agents == ["UA-one", "UA-two", "UA-one", "UA-two"]
    explicit = task_request("http://x.test/", "ua", headers={"User-Agent": "Mine"})
    mw.process_request(explicit)
    assert explicit.headers[b"User-Agent"] == b"Mine"


def rewrite(path: Path, text: str) -> None:
    """Rewrite ``path`` so its (mtime, size) stamp changes whatever the mtime grain."""
    stamp = path.stat().st_mtime_ns + 5_000_000_000
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))


def blacklist_of(crawler: Any, site_id: str = "hot") -> list[str] | None:
    config = site_config(crawler, site_id)
    return None if config is None else [p.pattern for p in config.blacklist]


def test_site_config_follows_file_changes(tmp_path: Path) -> None:
    sites = write_site(tmp_path / "sites", "hot", 'blacklist: ["/a"]')
    crawler = crawler_for(sites, METEORSEED_SITES_RELOAD_INTERVAL=0.0001)
    assert blacklist_of(crawler) == ["/a"]
    rewrite(sites / "hot.yaml", SITE.format(site_id="hot", extra='blacklist: ["/b"]'))
    wait_for(lambda: blacklist_of(crawler) == ["/b"])


def test_a_bad_edit_keeps_the_sites_last_good_config_on_the_worker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sites = write_site(tmp_path / "sites", "hot", 'blacklist: ["/a"]\nlimits: {rate: 3}')
    crawler = crawler_for(sites, METEORSEED_SITES_RELOAD_INTERVAL=0.0001)
    assert site_config(crawler, "hot").limits.rate == 3.0  # type: ignore[union-attr]
    with caplog.at_level(logging.ERROR, logger="meteorseed_scrapy.sites.loader"):
        rewrite(sites / "hot.yaml", SITE.format(site_id="hot", extra="limits: {rate: .nan}"))
        wait_for(lambda: blacklist_of(crawler) is not None  # each look may reload
                 and "limits.rate: must be a positive finite number, got nan" in caplog.text)
    assert site_config(crawler, "hot").limits.rate == 3.0  # type: ignore[union-attr]
    assert blacklist_of(crawler) == ["/a"]


def test_a_missing_sites_dir_is_looked_for_again(tmp_path: Path) -> None:
    crawler = crawler_for(tmp_path / "later", METEORSEED_SITES_RELOAD_INTERVAL=0.0001)
    assert site_config(crawler, "hot") is None
    write_site(tmp_path / "later", "hot", 'blacklist: ["/a"]')
    wait_for(lambda: blacklist_of(crawler) == ["/a"], timeout=10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_proxy_pool_rotates_scores_and_cools_down() -> None:
    clock = Clock()
    pool = ProxyPool(max_failures=2, cooldown=30, clock=clock)
    proxies = ("http://a:1", "http://b:1", "http://c:1")
    assert [pool.pick(proxies) for _ in range(3)] == list(proxies)  # round-robin
    pool.failure("http://a:1")  # a has one failure: the others are preferred
    assert {pool.pick(proxies) for _ in range(6)} == {"http://b:1", "http://c:1"}
    assert pool.failure("http://a:1") is True  # second in a row: cools down
    pool.failure("http://b:1")
    pool.failure("http://c:1")  # b and c now have a failure each; a is cooling down
    assert "http://a:1" not in {pool.pick(proxies) for _ in range(6)}
    pool.success("http://b:1")
    assert {pool.pick(proxies) for _ in range(4)} == {"http://b:1"}
    clock.now += 31  # a is back, with one more chance
    pool.failure("http://b:1")
    pool.failure("http://c:1")
    assert pool.failure("http://a:1") is True  # a single failure sends it back
    assert pool.failure("http://b:1") is True
    assert pool.failure("http://c:1") is True
    # Everything cools down: the one that comes back first.
    assert pool.pick(proxies) == "http://a:1"


def test_proxy_middleware_scores_407_5xx_and_connection_errors(tmp_path: Path) -> None:
    sites = write_site(tmp_path / "sites", "px", 'proxies: ["http://p1:8080", "http://p2:8080"]')
    crawler = crawler_for(sites, METEORSEED_PROXY_MAX_FAILURES=1, METEORSEED_PROXY_COOLDOWN=60)
    crawler.stats.open_spider()
    mw = ProxyPoolMiddleware.from_crawler(crawler)
    from scrapy.http import HtmlResponse
    from twisted.internet.error import ConnectionRefusedError

    first = task_request("http://x.test/1", "px")
    mw.process_request(first)
    assert first.meta["proxy"] == "http://p1:8080"
    mw.process_response(first, HtmlResponse(first.url, status=407, request=first))
    assert "proxy" not in first.meta  # the retry picks again
    for _ in range(3):
        request = task_request("http://x.test/2", "px")
        mw.process_request(request)
        assert request.meta["proxy"] == "http://p2:8080"
    mw.process_exception(request, ConnectionRefusedError())
    assert crawler.stats.get_value("meteorseed/proxy/cooldowns") == 2
    explicit = task_request("http://x.test/3", "px")
    explicit.meta["proxy"] = "http://mine:1"
    mw.process_request(explicit)
    assert explicit.meta["proxy"] == "http://mine:1"


# -- real workers -----------------------------------------------------------------------------


def _drained(r: redis.Redis, ns: str) -> None:
    keys = KeyLayout(ns)
    assert r.xlen(keys.stream) == 0
    assert r.xpending(keys.stream, keys.group)["pending"] == 0
    assert r.xlen(keys.dead) == 0


@pytest.mark.e2e
def test_worker_blacklist_robots_and_user_agents_seen_by_the_server(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, site: RecordingSite
) -> None:
    sites = write_site(tmp_path / "sites", "hy", 'blacklist: ["/admin/"]\n'
                       'user_agents: ["Agent-A", "Agent-B"]')
    urls = [f"{site.url}/page/{i}" for i in range(6)]
    banned = [f"{site.url}/admin/{i}" for i in range(2)]
    private = [f"{site.url}/private/{i}" for i in range(2)]
    enqueue(redis_url, namespace, [*urls, *banned, *private], site_id="hy")
    # The probe project sets ROBOTSTXT_OBEY False: -s puts the add-on's default back.
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_SITES_DIR=str(sites),
                          ROBOTSTXT_OBEY=True)
    assert worker.wait() == 0, worker.log()[-3000:]

    paths = site.paths()
    assert not [p for p in paths if p.startswith(("/admin/", "/private/"))]
    assert sorted(p for p in paths if p.startswith("/page/")) == [f"/page/{i}" for i in range(6)]
    assert paths.count("/robots.txt") == 1  # cached for the crawl
    agents = {ua for target, ua, _ in site.seen if target.startswith("/page/")}
    assert agents == {"Agent-A", "Agent-B"}
    assert set(stored_docs(tmp_path / "items.db")) == {f"hy:/page/{i}" for i in range(6)}
    stats = worker.stats()
    assert stats["meteorseed/blacklisted/hy"] == 2
    assert stats["meteorseed/outcome/ignored"] == 4  # 2 blacklisted + 2 robots-disallowed
    assert stats["meteorseed/acked"] == 10
    _drained(sync_redis, namespace)


@pytest.mark.e2e
def test_worker_rotates_away_from_a_dead_proxy_and_warms_cookies(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis, site: RecordingSite
) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    with RecordingSite() as proxy:
        sites = write_site(tmp_path / "sites", "px",
                           f'proxies: ["{dead}", "{proxy.url}"]\ncookie_warmup: true')
        urls = [f"{site.url}/page/{i}" for i in range(8)]
        enqueue(redis_url, namespace, urls, site_id="px")
        worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_SITES_DIR=str(sites),
                              METEORSEED_PROXY_MAX_FAILURES=1, METEORSEED_PROXY_COOLDOWN=600,
                              ROBOTSTXT_OBEY=True)
        assert worker.wait() == 0, worker.log()[-3000:]
    assert site.seen == []  # everything went through the proxy
    proxied = [urlsplit(target).path for target, _, _ in proxy.seen]
    assert sorted(p for p in proxied if p.startswith("/page/")) == [f"/page/{i}" for i in range(8)]
    # robots.txt went through the proxy too; the warm-up came first, once.
    assert [p for p in proxied if not p.startswith("/page/")] == ["/robots.txt", "/"]
    cookies = {cookie for target, _, cookie in proxy.seen if "/page/" in target}
    assert cookies == {"session=warm"}
    assert set(stored_docs(tmp_path / "items.db")) == {f"px:/page/{i}" for i in range(8)}
    stats = worker.stats()
    assert stats.get("meteorseed/proxy/cooldowns", 0) <= 1
    _drained(sync_redis, namespace)

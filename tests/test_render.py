"""``render: browser`` sites: config, wiring, and real workers with the system Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import enqueue, stored_docs
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from test_sites_e2e import finish, start_sites_worker

from meteorseed_scrapy.sites import render
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.schema import parse_site
from meteorseed_scrapy.sites.spider import RuleSpider
from meteorseed_scrapy.task.context import TASK_META_KEY
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.sites import DemoSite

REPO = Path(__file__).resolve().parents[1]
SITES = REPO / "example_project" / "sites"
CHROMIUM = render.DEFAULT_CHROMIUM
needs_chromium = pytest.mark.skipif(
    render.chromium_missing(CHROMIUM) is not None,
    reason=f"{render.chromium_missing(CHROMIUM)} (Debian package `chromium`; .ci/run installs it)")

BASE = {"site_id": "js", "version": 1, "list": {"items": "div.quote"},
        "fields": {"text": ".text::text"}, "unique_key": "text"}


def site(**extra: Any) -> dict[str, Any]:
    return {**BASE, **extra}


# -- config --------------------------------------------------------------------------------


def test_render_config_accepts_render_and_rendering() -> None:
    config = parse_site(site(render={"mode": "browser", "wait_for": "div.quote"}), "js.yaml")
    assert (config.rendering.mode, config.rendering.wait_for) == ("browser", "div.quote")
    assert parse_site(site(rendering={"mode": "none"}), "js.yaml").rendering.mode == "none"
    assert parse_site(site(), "js.yaml").rendering.mode == "none"


@pytest.mark.parametrize(("extra", "message"), [
    ({"render": {"mode": "browser"}}, "render.wait_for: is required"),
    ({"render": {"mode": "browser", "wait_for": "div[["}}, "render.wait_for: invalid selector"),
    ({"render": {"mode": "firefox", "wait_for": "p"}}, "render.mode: must be one of"),
    ({"render": {"mode": "browser", "wait_for": "p", "wait": 1}}, "render.wait: unknown key"),
    ({"render": {"mode": "none"}, "rendering": {"mode": "none"}}, "not both"),
    ({"format": "json", "list": {"items": "jobs"}, "fields": {"text": "title"},
      "render": {"mode": "browser", "wait_for": "p"}}, "render.mode: browser rendering is for"),
])
def test_bad_render_configs_name_the_field(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(RuleError, match=message.replace("[", r"\[")):
        parse_site(site(**extra), "js.yaml")


# -- wiring --------------------------------------------------------------------------------


def test_sites_spider_installs_the_lazy_browser_handler_with_caps() -> None:
    settings = Settings({"DOWNLOADER_MIDDLEWARES": {"tests.test_components.Other": 10}})
    RuleSpider.update_settings(settings)
    assert settings.getdict("DOWNLOAD_HANDLERS") == {"http": render.HANDLER,
                                                     "https": render.HANDLER}
    assert settings.getdict("DOWNLOADER_MIDDLEWARES") == {"tests.test_components.Other": 10,
                                                          render.RenderMiddleware: 760}
    assert settings.getint("PLAYWRIGHT_MAX_CONTEXTS") == 1
    assert settings.getint("PLAYWRIGHT_MAX_PAGES_PER_CONTEXT") == 4
    assert render.PLAYWRIGHT_ERRORS in settings.getlist("RETRY_EXCEPTIONS")
    own = Settings({"DOWNLOAD_HANDLERS": {"http": "my.Handler"}, "PLAYWRIGHT_MAX_CONTEXTS": 3})
    render.configure(own)
    assert own.getdict("DOWNLOAD_HANDLERS") == {"http": "my.Handler", "https": render.HANDLER}
    assert own.getint("PLAYWRIGHT_MAX_CONTEXTS") == 3
    other_reactor = Settings({"TWISTED_REACTOR": "twisted.internet.selectreactor.SelectReactor"})
    assert not render.configure(other_reactor)
    assert "http" not in other_reactor.getdict("DOWNLOAD_HANDLERS")


def test_launch_args_add_the_quiet_switches_the_project_did_not_set() -> None:
    updater, signin, checkin, registration = render.QUIET_ARGS
    gcm = [checkin, registration]
    assert render.launch_args([]) == [updater, signin, *gcm]
    assert render.launch_args(("--lang=fr",)) == ["--lang=fr", updater, signin, *gcm]
    own = "--component-updater=url-source=http://updates.example/"
    assert render.launch_args([own]) == [own, signin, *gcm]
    assert render.launch_args(["--gaia-url"]) == ["--gaia-url", updater, *gcm]
    assert render.launch_args(["--component-updater-x"]) == ["--component-updater-x", updater,
                                                              signin, *gcm]
    assert render.launch_args(["--gcm-checkin-url=x"]) == ["--gcm-checkin-url=x", updater,
                                                           signin, registration]


def test_chromium_path_setting_and_launch_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("METEORSEED_CHROMIUM_PATH", raising=False)  # (conftest: the tests')
    assert render.chromium_path(Settings()) == "/usr/bin/chromium"
    launch = Settings({"PLAYWRIGHT_LAUNCH_OPTIONS": {"executable_path": "/opt/c"}})
    assert render.chromium_path(launch) == "/opt/c"
    launch.set("METEORSEED_CHROMIUM_PATH", "/srv/chromium")
    assert render.chromium_path(launch) == "/srv/chromium"
    assert render.chromium_missing("/nonexistent/chromium") == (
        "Chromium not found at /nonexistent/chromium")


HANDLER_PROBE = """
import json
from pydispatch import dispatcher
from scrapy import signals
from scrapy.utils.reactor import install_reactor
install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
from scrapy.utils.test import get_crawler
from meteorseed_scrapy.sites.browser import BrowserHandler
from meteorseed_scrapy.sites.spider import RuleSpider

crawler = get_crawler(RuleSpider, {"METEORSEED_CHROMIUM_PATH": "/opt/chromium/chrome"})
http, https = BrowserHandler(crawler), BrowserHandler(crawler)
launchers = [r for r in dispatcher.getAllReceivers(crawler.signals.sender,
                                                   signals.engine_started)
             if getattr(r, "__self__", None) in (http, https)]
print(json.dumps({"shared": http.owner is http and https.owner is http,
                  "started": http.started or hasattr(http, "browser_provider"),
                  "launchers": len(launchers), "launch": http.config.launch_options}))
"""


def test_browser_handler_is_lazy_shared_and_uses_the_system_chromium() -> None:
    env = {k: v for k, v in os.environ.items() if k != "METEORSEED_CHROMIUM_PATH"}
    proc = subprocess.run([sys.executable, "-c", HANDLER_PROBE], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"shared": True, "started": False, "launchers": 0,
                     "launch": {"executable_path": "/opt/chromium/chrome", "headless": True,
                                "args": list(render.QUIET_ARGS)}}


def _middleware(sites_dir: Path, **settings: Any) -> render.RenderMiddleware:
    crawler = get_crawler(settings_dict={"METEORSEED_SITES_DIR": str(sites_dir),
                                         "DOWNLOAD_HANDLERS": {"http": render.HANDLER,
                                                               "https": render.HANDLER},
                                         **settings})
    return render.RenderMiddleware.from_crawler(crawler)


def _request(site_id: str, url: str = "http://127.0.0.1:1/js/quotes/1") -> Request:
    task = ExecTask.create(seed_id="s", site_id=site_id, url=url)
    return Request(url, meta={TASK_META_KEY: task})


def test_middleware_marks_only_tasks_of_rendering_sites(tmp_path: Path) -> None:
    shutil.copytree(SITES, tmp_path / "sites")
    mw = _middleware(tmp_path / "sites", METEORSEED_CHROMIUM_PATH=__file__ if os.access(
        __file__, os.X_OK) else "/bin/sh")
    quotes = _request("example_quotes")
    mw.process_request(quotes)
    assert quotes.meta["playwright"] is True and quotes.meta["playwright_context"] == "meteorseed"
    (method,) = quotes.meta["playwright_page_methods"]
    assert (method.method, method.args) == ("wait_for_selector", ("div.quote",))
    assert method.kwargs == {"state": "attached", "timeout": 30_000}
    assert quotes.meta["playwright_page_goto_kwargs"] == {"timeout": 30_000}
    news = _request("example_news", "http://127.0.0.1:1/news/list/1")
    robots = Request("http://127.0.0.1:1/robots.txt", meta={"meteorseed_site": "example_quotes"})
    for request in (news, robots):
        mw.process_request(request)
        assert "playwright" not in request.meta


def test_missing_chromium_fails_the_request_naming_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("METEORSEED_CHROMIUM_PATH", raising=False)  # (the environment wins)
    shutil.copytree(SITES, tmp_path / "sites")
    mw = _middleware(tmp_path / "sites", METEORSEED_CHROMIUM_PATH="/nonexistent/chromium")
    with pytest.raises(render.RenderUnavailable,
                       match="site example_quotes needs a browser: Chromium not found at"
                             " /nonexistent/chromium"):
        mw.process_request(_request("example_quotes"))
    mw.process_request(_request("example_news"))  # other sites are not affected


def test_without_the_browser_handler_rendering_sites_fail_clearly(tmp_path: Path) -> None:
    shutil.copytree(SITES, tmp_path / "sites")
    mw = _middleware(tmp_path / "sites", DOWNLOAD_HANDLERS={})
    with pytest.raises(render.RenderUnavailable, match="DOWNLOAD_HANDLERS http/https"):
        mw.process_request(_request("example_quotes"))


# -- real workers --------------------------------------------------------------------------


def test_quotes_shell_has_no_content_without_javascript(demo_site: DemoSite) -> None:
    with urllib.request.urlopen(f"{demo_site.url}/js/quotes/1", timeout=10) as reply:
        page = reply.read().decode()
    assert 'class="quote"' not in page and "/js/api/quotes?page=1" in page


@needs_chromium
@pytest.mark.e2e
def test_rendered_site_items_are_stored_by_a_worker(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any,
        demo_site: DemoSite) -> None:
    shutil.copytree(SITES, tmp_path / "sites")
    enqueue(redis_url, namespace, [f"{demo_site.url}/js/quotes/1"], site_id="example_quotes")
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/4"], site_id="example_news")
    log = finish(start_sites_worker(tmp_path, redis_url, namespace, tmp_path / "sites"),
                 tmp_path, timeout=180)
    docs = stored_docs(tmp_path / "items.db")
    quotes = {k: d for k, d in docs.items() if d["site_id"] == "example_quotes"}
    assert len(quotes) == 30, log[-4000:]  # 3 pages, the 2nd and 3rd found via rendered links
    first = quotes["example_quotes:1"]
    assert first["text"] and first["author"] and len(first["tags"]) == 2
    assert first["added"] == "2024-03-03T00:00:00Z"
    assert "'playwright/browser_count': 1" in log
    assert "'meteorseed/render/pages/example_quotes': 3" in log
    # every page was closed again
    assert "'playwright/page_count': 3" in log and "'playwright/page_count/closed': 3" in log
    assert sync_redis.xlen(f"{namespace}:dead") == 0


@pytest.mark.e2e
def test_without_chromium_only_the_rendering_site_fails(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any,
        demo_site: DemoSite) -> None:
    shutil.copytree(SITES, tmp_path / "sites")
    enqueue(redis_url, namespace, [f"{demo_site.url}/js/quotes/1"], site_id="example_quotes")
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/list/5"], site_id="example_news")
    worker = start_sites_worker(tmp_path, redis_url, namespace, tmp_path / "sites",
                                settings={"METEORSEED_CHROMIUM_PATH": "/nonexistent/chromium"})
    log = finish(worker, tmp_path)
    docs = stored_docs(tmp_path / "items.db")
    assert sorted(d["site_id"] for d in docs.values()) == ["example_news"] * 10
    (dead,) = sync_redis.xrange(f"{namespace}:dead")
    assert "Chromium not found at /nonexistent/chromium" in str(dead[1])
    assert "Site example_quotes renders with a browser, but Chromium not found at" in log
    assert "Starting download handler" not in log and "playwright/browser_count" not in log


NEVER_READY = """site_id: never_ready
version: 1
render: {mode: browser, wait_for: "div.never"}
list: {items: "div.quote"}
fields: {text: ".text::text"}
unique_key: text
limits: {timeout: 5, retries: 0}
robots: false
"""
# (timeout: the page's load must fit in it too, which took more than 1 s on a loaded machine)


@needs_chromium
@pytest.mark.e2e
def test_a_page_that_never_gets_ready_times_out_and_is_closed(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any,
        demo_site: DemoSite) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "never.yaml").write_text(NEVER_READY)
    enqueue(redis_url, namespace, [f"{demo_site.url}/js/quotes/1"], site_id="never_ready")
    log = finish(start_sites_worker(tmp_path, redis_url, namespace, sites), tmp_path,
                 timeout=180)
    (dead,) = sync_redis.xrange(f"{namespace}:dead")
    assert "TimeoutError" in dead[1]["reason"] and "div.never" in dead[1]["reason"]
    assert "'playwright/page_count': 1" in log and "'playwright/page_count/closed': 1" in log
    assert stored_docs(tmp_path / "items.db") == {}

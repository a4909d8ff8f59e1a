"""Scrapy's everyday commands in a project with the add-on: local crawls, never Redis.

Each command runs for real (a subprocess in ``tests/e2e_project``, against the demo site on
loopback and a real Redis); every subprocess has a timeout, so a command that hangs fails. Where
the command is local, not one key of the namespace may be written and no item stored;
``runspider`` and ``crawl -O`` still run as workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from scrapy import Request, Spider
from scrapy.core.downloader import Downloader

from meteorseed_scrapy.task.context import TASK_META_KEY, Scrape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.local_crawl import (
    LOCAL_META_KEY,
    command_of,
    local_crawl,
    local_request,
)
from meteorseed_scrapy.testing.redis_server import free_port
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import PROJECT, REPO, enqueue, stored_docs
from tests.subprocess_env import python_path

TIMEOUT = 120  # a command that hangs fails here, not in the CI's own timeout

CONTRACT_SPIDERS = '''
import scrapy


class Contracts(scrapy.Spider):
    name = "contracts"

    def parse(self, response):
        """An article page.

        @url {site}/news/article/1
        @returns items 1 1
        @returns requests 0 0
        @scrapes title
        """
        yield {{"title": response.css("title::text").get(), "unique_key": response.url}}


class Failing(scrapy.Spider):
    name = "failing"

    def parse(self, response):
        """@url {site}/news/article/2
        @scrapes no_such_field
        """
        yield {{"title": response.css("title::text").get()}}
'''


class Project:
    """``scrapy <command>`` in the e2e project, with the namespace, the store and (for
    ``scrapy check``) a module of contract spiders of its own."""

    def __init__(self, tmp_path: Path, redis_url: str, namespace: str, site: DemoSite) -> None:
        self.tmp, self.redis_url, self.namespace, self.site = tmp_path, redis_url, namespace, site
        self.store = tmp_path / "items.db"
        extra = tmp_path / "extra"
        extra.mkdir()
        (extra / "command_spiders.py").write_text(CONTRACT_SPIDERS.format(site=site.url))
        self.pythonpath = python_path(REPO, PROJECT, extra)

    def run(self, *args: str, redis_url: str | None = None, cwd: Path = PROJECT,
            env: dict[str, str] | None = None, **settings: Any) -> subprocess.CompletedProcess[str]:
        base = {"METEORSEED_REDIS_URL": redis_url or self.redis_url,
                "METEORSEED_NAMESPACE": self.namespace,
                "METEORSEED_STORE_URI": f"sqlite:///{self.store}",
                "SPIDER_MODULES": "probe.spiders,command_spiders", **settings}
        command = [sys.executable, "-m", "scrapy.cmdline", *args]
        for key, value in base.items():
            command += ["-s", f"{key}={value}"]
        full_env = dict(os.environ, PYTHONPATH=self.pythonpath, SCRAPY_PROJECT="default",
                        **(env or {}))
        full_env.pop("SCRAPY_SETTINGS_MODULE", None)  # the probe project's scrapy.cfg decides
        if cwd != PROJECT:
            full_env["SCRAPY_SETTINGS_MODULE"] = "probe.settings"
        try:
            return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True,
                                  text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"`scrapy {' '.join(args)}` hung ({TIMEOUT}s):\n"
                                 f"{_text(exc.stderr)[-3000:]}") from None

    def runspider(self, source: str, **settings: Any) -> subprocess.CompletedProcess[str]:
        """``scrapy runspider`` of ``source`` as a worker that closes once idle."""
        spider_file = self.tmp / "spider_file.py"
        spider_file.write_text(source)
        settings = {"METEORSEED_IDLE_CLOSE": 1, "METEORSEED_CONSUMER": "w1", **settings}
        done = self.run("runspider", str(spider_file), cwd=self.tmp, **settings)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "StreamScheduler reading" in done.stderr and "Local crawl" not in done.stderr
        return done

    def keys(self) -> list[str]:
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            return sorted(client.scan_iter(f"{self.namespace}:*", count=1000))
        finally:
            client.close()

    def added(self) -> int:
        """Tasks ever added to the namespace's task streams."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            return int(client.hget(f"{self.namespace}:counts", "added") or 0)
        finally:
            client.close()

    def stream_urls(self) -> set[str]:
        """The URL of every message in every stream of the namespace (tasks, dead letters)."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        urls: set[str] = set()
        try:
            for key in client.scan_iter(f"{self.namespace}:*", count=1000):
                if client.type(key) == "stream":
                    for _, fields in client.xrange(key):
                        urls.update(v for v in fields.values() if self.site.url in v)
        finally:
            client.close()
        return urls

    def assert_local(self, done: subprocess.CompletedProcess[str], command: str) -> None:
        assert f"Local crawl: its spider's start() is Scrapy's `{command}` command's" \
            in done.stderr, done.stderr[-3000:]
        assert self.keys() == []
        assert not self.store.exists()  # the store stage was off: not even opened


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


@pytest.fixture
def project(tmp_path: Path, redis_url: str, namespace: str) -> Iterator[Project]:
    with DemoSite() as site:  # its own: the hit counts are this test's
        yield Project(tmp_path, redis_url, namespace, site)


def test_fetch_prints_the_body_and_writes_nothing(project: Project) -> None:
    done = project.run("fetch", f"{project.site.url}/news/article/1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "<title>" in done.stdout and "Back to the news" in done.stdout
    project.assert_local(done, "fetch")
    assert "StreamScheduler reading" not in done.stderr


def test_fetch_and_shell_work_with_redis_unreachable(project: Project) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    done = project.run("fetch", "--headers", f"{project.site.url}/news/article/1",
                       redis_url=nowhere)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "< Content-Type: text/html" in done.stdout
    done = project.run("shell", f"{project.site.url}/news/article/1", "-c", "response.status",
                       redis_url=nowhere)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "200"
    assert "Local crawl: Scrapy's shell drives it" in done.stderr
    assert "] ERROR:" not in done.stderr and "Traceback" not in done.stderr


def test_shell_prints_the_status(project: Project) -> None:
    url = f"{project.site.url}/news/article/1"
    done = project.run("shell", url, "-c", "(response.status, response.css('title').get())")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("(200, '<title>")
    assert "Local crawl: Scrapy's shell drives it" in done.stderr
    assert project.keys() == []
    # In a project spider's shell (its own start() untouched) too: the shell, not the spider.
    done = project.run("shell", "--spider", "probe", url, "-c", "response.status")
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "200", done.stderr
    assert project.keys() == [] and project.site.hits("/news/article/1") == 2
    assert not project.store.exists()  # (its store stage is on, and never written to)


def test_view_opens_the_page_in_the_browser(project: Project) -> None:
    seen = project.tmp / "seen.html"
    browser = project.tmp / "browser.py"
    browser.write_text(textwrap.dedent(f"""\
        import sys, shutil
        shutil.copy(sys.argv[1].removeprefix("file://"), {str(seen)!r})
        """))
    done = project.run("view", f"{project.site.url}/news/article/3",
                       env={"BROWSER": f"{sys.executable} {browser} %s"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Back to the news" in seen.read_text()
    assert f'<base href="{project.site.url}/news/article/3">' in seen.read_text()
    project.assert_local(done, "fetch")  # `view` is `fetch` with another output


def test_parse_shows_the_items_and_the_requests(project: Project) -> None:
    done = project.run("parse", "--spider", "probe", "-c", "parse", "-a", "follow=1",
                       f"{project.site.url}/news/article/1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "# Scraped Items" in done.stdout
    assert "'unique_key': '/news/article/1'" in done.stdout
    assert f"<GET {project.site.url}/news/list/1>" in done.stdout  # the link it follows
    project.assert_local(done, "parse")


def test_check_runs_the_contracts_and_a_failing_one_fails(project: Project) -> None:
    done = project.run("check", "contracts")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Ran 3 contracts" in done.stderr and "OK" in done.stderr
    assert project.keys() == [] and not project.store.exists()  # (check logs nothing)
    done = project.run("check", "failing")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Ran 1 contract" in done.stderr and "Missing fields: no_such_field" in done.stderr
    assert project.keys() == [] and not project.store.exists()


def test_bench_writes_nothing(project: Project) -> None:
    done = project.run("bench", CLOSESPIDER_TIMEOUT=2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'finish_reason': 'closespider_timeout'" in done.stderr
    stats = done.stderr[done.stderr.index("Dumping Scrapy stats"):]
    assert "'downloader/response_status_count/200'" in stats  # it did crawl
    project.assert_local(done, "bench")


RUNSPIDER = '''
import scrapy


class One(scrapy.Spider):
    name = "one"

    async def start(self):
        yield scrapy.Request({url!r})

    def parse(self, response):
        yield {{"unique_key": response.url, "title": response.css("title::text").get()}}
'''


def test_runspider_and_crawl_feed_still_run_as_workers(project: Project) -> None:
    # runspider: its start request becomes a task of the stream, its item is stored.
    url = f"{project.site.url}/news/article/4"
    project.runspider(RUNSPIDER.format(url=url))
    assert project.added() == 1  # its task went through the stream
    docs = stored_docs(project.store)
    assert [d["url"] for d in docs.values()] == [url]
    # crawl -O: tasks from the stream, items in the feed and in the store.
    urls = [f"{project.site.url}/news/article/{n}" for n in (5, 6)]
    enqueue(project.redis_url, project.namespace, urls, site_id="probe")
    feed = project.tmp / "out.json"
    done = project.run("crawl", "probe", "-O", str(feed), METEORSEED_IDLE_CLOSE=1,
                       METEORSEED_CONSUMER="w2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "StreamScheduler reading" in done.stderr
    assert sorted(i["unique_key"] for i in json.loads(feed.read_text())) == [
        "/news/article/5", "/news/article/6"]
    assert len(stored_docs(project.store)) == 3 and project.added() == 3


SELECT_REACTOR = "twisted.internet.selectreactor.SelectReactor"


def test_a_worker_on_another_reactor_is_refused_naming_the_setting(project: Project) -> None:
    # (it opened and never read a task: a hang until killed)
    url = f"{project.site.url}/news/article/7"
    spider_file = project.tmp / "spider_file.py"
    spider_file.write_text(RUNSPIDER.format(url=url))
    done = project.run("runspider", str(spider_file), cwd=project.tmp,
                       TWISTED_REACTOR=SELECT_REACTOR, METEORSEED_IDLE_CLOSE=1)
    assert done.returncode == 1, done.stderr[-3000:]
    first_error = next(line for line in done.stderr.splitlines() if "] ERROR:" in line)
    assert first_error.endswith(
        "Invalid setting, the crawl cannot start: TWISTED_REACTOR: a MeteorSeed worker crawl "
        "needs asyncio, twisted.internet.asyncioreactor.AsyncioSelectorReactor (Scrapy's "
        f"default), got '{SELECT_REACTOR}'"), first_error
    assert project.added() == 0 and project.site.hits("/news/article/7") == 0


def test_a_local_command_runs_on_any_reactor(project: Project) -> None:
    done = project.run("fetch", f"{project.site.url}/news/article/8",
                       TWISTED_REACTOR=SELECT_REACTOR, LOG_LEVEL="DEBUG")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Back to the news" in done.stdout and f"Using reactor: {SELECT_REACTOR}" in done.stderr
    project.assert_local(done, "fetch")


def test_a_worker_with_no_download_limit_is_refused_naming_the_setting(project: Project) -> None:
    # (Scrapy's CONCURRENT_REQUESTS = 0, "no limit", gave a worker that held one task at a time)
    url = f"{project.site.url}/news/article/9"
    spider_file = project.tmp / "spider_file.py"
    spider_file.write_text(RUNSPIDER.format(url=url))
    done = project.run("runspider", str(spider_file), cwd=project.tmp, CONCURRENT_REQUESTS=0,
                       METEORSEED_IDLE_CLOSE=1)
    assert done.returncode == 1, done.stderr[-3000:]
    first_error = next(line for line in done.stderr.splitlines() if "] ERROR:" in line)
    assert first_error.endswith(
        "Invalid setting, the crawl cannot start: CONCURRENT_REQUESTS: 0 is Scrapy's \"no "
        "limit\", but a MeteorSeed worker reads and holds tasks for that many downloads: set a "
        "number (Scrapy's default is 16)"), first_error
    assert project.added() == 0 and project.site.hits("/news/article/9") == 0


def _zero_is_no_limit() -> bool:
    """Whether this Scrapy's downloader takes ``CONCURRENT_REQUESTS = 0`` as "no limit" (2.19
    does; 2.14 downloads nothing, so stock Scrapy's own ``fetch`` hangs there). Its own
    ``needs_backout`` asked, on a downloader not started (a started one needs an event loop)."""
    downloader = Downloader.__new__(Downloader)
    downloader.total_concurrency, downloader.active = 0, set()
    return not downloader.needs_backout()


def test_a_local_command_takes_no_download_limit_as_scrapy_does(project: Project) -> None:
    if not _zero_is_no_limit():
        pytest.skip("on this Scrapy a CONCURRENT_REQUESTS of 0 downloads nothing")
    done = project.run("fetch", f"{project.site.url}/news/article/10", CONCURRENT_REQUESTS=0)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Back to the news" in done.stdout
    project.assert_local(done, "fetch")


IDLE_SPIDER = '''
import scrapy
from scrapy import signals


class IdleLocal(scrapy.Spider):
    """A worker whose spider_idle handler crawls one page by hand, outside any task."""

    name = "idle_local"
    crawled = False

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.idle, signals.spider_idle)
        return spider

    async def start(self):
        return
        yield

    def idle(self):
        if not self.crawled:
            self.crawled = True
            self.crawler.engine.crawl(scrapy.Request({url!r}, callback=self.parse_list))

    def parse_list(self, response):
        links = response.css("a::attr(href)").re(r".*/news/article/[12]$")
        for href in links:
            yield response.follow(href, callback=self.parse_article)

    def parse_article(self, response):
        yield {{"url": response.url, "unique_key": response.url}}
'''


def test_a_request_crawled_by_hand_in_a_worker_stays_local(project: Project) -> None:
    done = project.runspider(IDLE_SPIDER.format(url=f"{project.site.url}/news/list/1"),
                             METEORSEED_IDLE_CLOSE=2)
    assert project.site.hits("/news/list/1") == 1
    # Its children were crawled too, in memory: nothing of them is in any stream.
    assert sorted(d["url"] for d in stored_docs(project.store).values()) == [
        f"{project.site.url}/news/article/1", f"{project.site.url}/news/article/2"]
    assert project.stream_urls() == set() and project.added() == 0
    assert "Cannot make a task" not in done.stderr


# -- the rule itself (task/local_crawl.py) ---------------------------------------------------

def _start_of(module: str) -> Any:
    async def start(self: Any) -> Any:
        yield None

    start.__module__ = module
    return start


def test_a_crawl_is_local_when_its_start_is_a_scrapy_commands() -> None:
    from scrapy.commands.bench import _BenchSpider
    from scrapy.utils.spider import DefaultSpider

    assert command_of(_BenchSpider) == "bench"
    for module, command in (("scrapy.commands.fetch", "fetch"),
                            ("scrapy.commands.parse", "parse"),
                            ("scrapy.commands.check", "check")):
        spidercls = type("Replaced", (DefaultSpider,), {"start": _start_of(module)})
        assert command_of(spidercls) == command
        crawler = SimpleNamespace(spidercls=spidercls, crawling=True, engine=None)
        assert local_crawl(crawler) == f"its spider's start() is Scrapy's `{command}` command's"
    for module in ("probe.spiders.probe", "scrapy.commandsextra", "scrapy.spiders"):
        spidercls = type("Own", (DefaultSpider,), {"start": _start_of(module)})
        assert command_of(spidercls) is None
    assert command_of(DefaultSpider) is None and command_of(None) is None


def test_a_crawl_is_local_when_scrapys_shell_drives_it() -> None:
    def crawler(crawling: bool, close_if_idle: bool | None) -> Any:
        slot = None if close_if_idle is None else SimpleNamespace(close_if_idle=close_if_idle)
        return SimpleNamespace(spidercls=Spider, crawling=crawling,
                               engine=SimpleNamespace(_slot=slot))

    assert local_crawl(crawler(False, False)) == "Scrapy's shell drives it"
    assert local_crawl(crawler(True, True)) is None  # scrapy crawl
    assert local_crawl(crawler(True, False)) is None
    assert local_crawl(crawler(False, True)) is None  # a test's crawler, opened by hand
    assert local_crawl(crawler(False, None)) is None  # (a fake engine)
    assert local_crawl(SimpleNamespace(spidercls=Spider)) is None


def test_in_a_worker_only_a_request_crawled_outside_any_task_is_local() -> None:
    task = ExecTask.create(seed_id="s", site_id="shop", url="https://shop.test/p/1")
    scrape = Scrape(task)
    assert local_request(Request("https://shop.test/p/2", meta={TASK_META_KEY: task}),
                         None) is False  # a task's retry or redirect
    assert local_request(Request("https://shop.test/", meta={"is_start_request": True}),
                         None) is False  # a start request: a task
    assert local_request(Request("https://shop.test/p/3"), scrape) is False  # a task's child
    by_hand = Request("https://shop.test/p/4")
    assert local_request(by_hand, None) is True
    assert by_hand.meta[LOCAL_META_KEY] is True
    # Its redirect (meta copied), even were a task's scrape current then: local.
    assert local_request(by_hand.replace(url="https://shop.test/p/5"), scrape) is True


def test_in_a_worker_local_requests_go_out_first_and_never_to_redis(
        redis_url: str, namespace: str) -> None:
    from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
    from meteorseed_scrapy.queue.keys import KeyLayout
    from meteorseed_scrapy.task.context import task_of
    from meteorseed_scrapy.testing.polling import wait_until
    from tests.test_scheduler_settling import make_task, scheduler_on, take

    async def main() -> None:
        async with scheduler_on(redis_url, namespace) as (scheduler, engine, client):
            # (what Scrapy's own queue asks of the downloader)
            engine.downloader.get_slot_key = lambda request: "shop.test"
            engine.downloader.slots = {}
            await TaskWriter(client, KeyLayout(namespace)).add([make_task(1)], dedup=False)
            await wait_until(scheduler.has_pending_requests, timeout=30)  # the task is ready
            by_hand = Request("https://shop.test/by-hand")
            assert scheduler.enqueue_request(by_hand) is True
            assert scheduler.next_request() is by_hand  # before the stream's task
            request = await take(scheduler)
            assert task_of(request) is not None and request.url == "https://shop.test/p/1"
            # A request its callback yields (no scrape current: not a task's) is local too.
            child = Request("https://shop.test/by-hand/child")
            assert scheduler.enqueue_request(child) is True
            assert scheduler.next_request() is child and scheduler.next_request() is None
            assert await client.hget(f"{namespace}:counts", "added") == "1"
            assert scheduler.stats.get_value("meteorseed/children/enqueued") is None

    asyncio.run(main())


def test_the_metrics_extension_stays_off_in_a_commands_crawl() -> None:
    from scrapy.exceptions import NotConfigured
    from scrapy.utils.spider import DefaultSpider
    from scrapy.utils.test import get_crawler

    from meteorseed_scrapy.observability.metrics import MetricsExtension

    settings = {"METEORSEED_METRICS_PORT": free_port(),
                "METEORSEED_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    fetched = type("Fetched", (DefaultSpider,), {"start": _start_of("scrapy.commands.fetch")})
    with pytest.raises(NotConfigured, match="not a worker"):
        MetricsExtension.from_crawler(get_crawler(fetched, settings))
    assert isinstance(MetricsExtension.from_crawler(get_crawler(DefaultSpider, settings)),
                      MetricsExtension)  # (a worker's: on; it binds its port when opened)

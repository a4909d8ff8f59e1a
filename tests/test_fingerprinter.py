"""Dedup keys follow a project's REQUEST_FINGERPRINTER_CLASS, as Scrapy's dupefilter would; the
canonical-URL default stays when the project keeps Scrapy's fingerprinter."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.test import get_crawler
from w3lib.url import url_query_cleaner

from meteorseed_scrapy.queue.enqueue.dedup import (
    fingerprint_bytes,
    project_fingerprinter,
    settings_fingerprinter,
)
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.validation import TaskError
from tests.e2e_helpers import enqueue, start_worker, stored_docs
from tests.queue_helpers import is_seen
from tests.test_seed_expand import run_cli, seed_line, summary_of

CUSTOM = "tests.test_fingerprinter.IgnoreSession"  # for the commands run as subprocesses
HERE = f"{__name__}.IgnoreSession"  # this very class, however pytest imported the module


class IgnoreSession:
    """A project's fingerprinter: the ``sid`` query parameter does not make a new request."""

    def __init__(self, crawler: Any = None) -> None:
        self.scrapys = RequestFingerprinter(crawler)

    @classmethod
    def from_crawler(cls, crawler: Any) -> IgnoreSession:
        return cls(crawler)

    def fingerprint(self, request: Request) -> bytes:
        url = url_query_cleaner(request.url, ["sid"], remove=True)
        return self.scrapys.fingerprint(request.replace(url=url))


class Answers:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def fingerprint(self, request: Request) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def task(url: str, **fields: Any) -> ExecTask:
    return ExecTask(task_id="t" + hashlib.sha1(url.encode()).hexdigest()[:8], seed_id="s",
                    site_id="news", url=url, **fields)


A, B = "https://a.example/p?id=1&sid=abc", "https://a.example/p?sid=xyz&id=1"


def test_a_custom_fingerprinter_decides_what_a_duplicate_is() -> None:
    fp = IgnoreSession()
    assert fingerprint_bytes(task(A)) != fingerprint_bytes(task(B))  # canonical URLs differ
    assert fingerprint_bytes(task(A), fingerprinter=fp) == fingerprint_bytes(task(B),
                                                                             fingerprinter=fp)
    other = fingerprint_bytes(task("https://a.example/p?id=2&sid=abc"), fingerprinter=fp)
    assert other != fingerprint_bytes(task(A), fingerprinter=fp)
    posted = fingerprint_bytes(task(A, method="POST", body="q=1"), fingerprinter=fp)
    assert posted != fingerprint_bytes(task(A), fingerprinter=fp)  # method and body count
    assert len(posted) == 16


def test_scrapys_own_fingerprinter_keeps_the_fast_canonical_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="meteorseed_scrapy.queue.enqueue.dedup"):
        assert project_fingerprinter(get_crawler()) is None
        assert settings_fingerprinter({}) is None
    assert "Dedup keys: canonical URLs" in caplog.text


def test_the_crawlers_fingerprinter_is_used_when_the_project_sets_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crawler = get_crawler(settings_dict={"REQUEST_FINGERPRINTER_CLASS": HERE})
    with caplog.at_level(logging.INFO, logger="meteorseed_scrapy.queue.enqueue.dedup"):
        fp = project_fingerprinter(crawler)
    assert isinstance(fp, IgnoreSession)
    assert f"REQUEST_FINGERPRINTER_CLASS {HERE}" in caplog.text
    assert isinstance(settings_fingerprinter({"REQUEST_FINGERPRINTER_CLASS": IgnoreSession}),
                      IgnoreSession)


@pytest.mark.parametrize("answer", [
    None, "", b"", "text", 7, ["x"], ValueError("boom"), TypeError("bad"), KeyError("k"),
    RecursionError("deep"),
])
def test_a_failing_fingerprinter_refuses_the_task_naming_the_url(answer: Any) -> None:
    writer = TaskWriter(None, KeyLayout("ns"), fingerprinter=Answers(answer))  # type: ignore[arg-type]
    with pytest.raises(TaskError) as info:
        writer.encode(task(A))
    assert info.value.field == "url"
    assert "REQUEST_FINGERPRINTER_CLASS" in str(info.value)


@given(st.binary(min_size=1, max_size=64))
def test_any_bytes_a_fingerprinter_returns_become_sixteen(raw: bytes) -> None:
    key = fingerprint_bytes(task(A), fingerprinter=Answers(raw))
    assert len(key) == 16
    assert key != fingerprint_bytes(task(A))


def test_the_writer_dedups_with_the_projects_fingerprints(redis_url: str, namespace: str) -> None:
    async def main() -> tuple[int, int, bool]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            writer = TaskWriter(client, KeyLayout(namespace), fingerprinter=IgnoreSession())
            added = await writer.add([task(A), task(B)])
            seen = await is_seen(writer, task("https://a.example/p?id=1&sid=other"))
            return added.enqueued, added.duplicates, seen
        finally:
            await client.aclose()

    assert asyncio.run(main()) == (1, 1, True)


def _project(tmp_path: Path, fingerprinter: str | None) -> Path:
    package = tmp_path / "fpproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    setting = f"REQUEST_FINGERPRINTER_CLASS = {fingerprinter!r}\n" if fingerprinter else ""
    (package / "settings.py").write_text('BOT_NAME = "fpproject"\n' + setting)
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = fpproject.settings\n")
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(seed_line([A, B]) + "\n")
    return seeds


@pytest.mark.parametrize(("fingerprinter", "counts"), [(CUSTOM, (1, 1)), (None, (2, 0))])
def test_seed_expand_in_a_project_uses_its_fingerprinter(
    tmp_path: Path, redis_url: str, namespace: str, fingerprinter: str | None,
    counts: tuple[int, int],
) -> None:
    seeds = _project(tmp_path, fingerprinter)
    done = run_cli([str(seeds)], tmp_path, settings={
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace})
    assert done.returncode == 0, done.stderr
    assert summary_of(done.stdout) == (1, *counts, 0)
    assert ("REQUEST_FINGERPRINTER_CLASS IgnoreSession" in done.stderr) == bool(fingerprinter)


def test_seed_expand_refuses_a_fingerprinter_it_cannot_load(
    tmp_path: Path, redis_url: str, namespace: str,
) -> None:
    seeds = _project(tmp_path, "fpproject.nowhere.Nothing")
    done = run_cli([str(seeds)], tmp_path, settings={
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace})
    assert done.returncode != 0
    assert "REQUEST_FINGERPRINTER_CLASS" in done.stderr
    assert "Traceback" not in done.stderr


# -- a worker: child requests are deduplicated by the project's fingerprinter ----------------------

class _Links(BaseHTTPRequestHandler):
    """``/`` links to three pages, two of them the same but for ``sid``."""

    def do_GET(self) -> None:
        if self.path == "/":
            body = b'<a href="/a?sid=1">1</a><a href="/a?sid=2">2</a><a href="/b?sid=3">3</a>'
        elif self.path.startswith(("/a?", "/b?")):
            body = b"<title>leaf</title>"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def links_site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Links)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.e2e
@pytest.mark.parametrize(("fingerprinter", "children"), [(CUSTOM, {"/a?sid=1", "/b?sid=3"}),
                                                         (None, {"/a?sid=1", "/a?sid=2",
                                                                 "/b?sid=3"})])
def test_a_worker_dedups_child_requests_with_the_projects_fingerprinter(
    tmp_path: Path, redis_url: str, namespace: str, links_site: str, fingerprinter: str | None,
    children: set[str],
) -> None:
    settings = {"REQUEST_FINGERPRINTER_CLASS": fingerprinter} if fingerprinter else {}
    enqueue(redis_url, namespace, [f"{links_site}/"])
    worker = start_worker(tmp_path, redis_url, namespace, spider_args={"follow": "1"},
                          **settings)
    assert worker.wait() == 0
    assert set(stored_docs(tmp_path / "items.db")) == {"probe:/", *(f"probe:{c}" for c in children)}
    stats = worker.stats()
    assert stats["meteorseed/children/enqueued"] == len(children)
    assert stats.get("meteorseed/children/duplicates", 0) == 3 - len(children)
    expected = (f"REQUEST_FINGERPRINTER_CLASS {CUSTOM}" if fingerprinter
                else "Dedup keys: canonical URLs")
    assert expected in worker.log()

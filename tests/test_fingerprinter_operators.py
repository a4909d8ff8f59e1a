"""Operator commands key dedup records as a project's workers do when the project sets its own
``REQUEST_FINGERPRINTER_CLASS``: ``meteorseed dead requeue``, ``meteorseed serve`` (dispatch,
``GET /tasks?url=``, requeue), ``meteorseed seeder`` and the scrapy-redis migration. A project
whose class or settings cannot be loaded warns and falls back to canonical URLs, never crashes.

The project is tests/test_fingerprinter.py's: ``IgnoreSession`` ignores the ``sid`` parameter,
so ``?sid=1`` and ``?sid=2`` are one request to it and two canonical URLs.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import pickle
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.python import global_object_name

from meteorseed_scrapy.api.background import ServerThread
from meteorseed_scrapy.api.config import CONFIG, ApiConfig
from meteorseed_scrapy.cli import main
from meteorseed_scrapy.cli import serve as serve_cli
from meteorseed_scrapy.migrate.command import run_migration
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.seeding import runner
from meteorseed_scrapy.seeding.seeder import SeederConfig
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.api_helpers import TOKEN, Client, url_list
from tests.test_cli import add_dead
from tests.test_cli import run as run_cli
from tests.test_fingerprinter import CUSTOM, IgnoreSession, _project

FIRST, SECOND = "https://a.example/p?sid=1", "https://a.example/p?sid=2"
PROJECT_KEYS = f"REQUEST_FINGERPRINTER_CLASS {CUSTOM}"
WARNING = "cannot build the project's REQUEST_FINGERPRINTER_CLASS"
#: Ways a project can be broken: its class cannot be imported, its settings module raises.
BROKEN = ["class", "settings"]

Enter = Callable[[str | None], Path]


def _forget_project() -> None:
    for name in ("fpproject.settings", "fpproject"):
        sys.modules.pop(name, None)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Enter]:
    """``project(fingerprinter)``: from now on the test runs inside that Scrapy project."""

    def enter(fingerprinter: str | None) -> Path:
        _project(tmp_path, fingerprinter)
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        # get_project_settings() sets it from scrapy.cfg for the rest of the process: set here
        # instead, so that it is undone after the test.
        monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "fpproject.settings")
        return tmp_path

    _forget_project()  # (every test's project is a new fpproject package)
    yield enter
    _forget_project()


def _broken(project: Enter, how: str) -> None:
    if how == "class":
        project("fpproject.nowhere.Nothing")
    else:
        root = project(CUSTOM)
        (root / "fpproject" / "settings.py").write_text("raise RuntimeError('broken settings')\n")


def _add(redis_url: str, namespace: str, urls: list[str], fingerprinter: Any = None,
         site: str = "news") -> tuple[int, int]:
    """(enqueued, duplicates) of a writer keying as the project's workers (``fingerprinter``)."""
    tasks = [ExecTask.create(seed_id="later", site_id=site, url=url) for url in urls]

    async def main() -> tuple[int, int]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            added = await TaskWriter(client, KeyLayout(namespace),
                                     fingerprinter=fingerprinter).add(tasks)
            return added.enqueued, added.duplicates
        finally:
            await client.aclose()

    return asyncio.run(main())


def _dead(sync_redis: redis.Redis, namespace: str, url: str, site: str = "news") -> str:
    task = ExecTask.create(seed_id="s", site_id=site, url=url)
    return add_dead(sync_redis, KeyLayout(namespace), task.to_message()["t"])


# -- meteorseed dead requeue -----------------------------------------------------------------------

def test_requeue_records_the_url_under_the_projects_key(
        project: Enter, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    project(CUSTOM)
    dead_id = _dead(sync_redis, namespace, FIRST)
    code, out, err = run_cli(redis_url, namespace, "dead", "requeue", dead_id, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [r["id"] for r in result["requeued"]] == [dead_id]
    assert result["dedup_keys"] == PROJECT_KEYS
    # The project's seeders key ?sid=2 as its workers do: the requeued ?sid=1 already holds it.
    assert _add(redis_url, namespace, [SECOND], IgnoreSession()) == (0, 1)


def test_requeue_says_its_keys_in_text(
        project: Enter, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    project(CUSTOM)
    dead_id = _dead(sync_redis, namespace, FIRST)
    code, out, err = run_cli(redis_url, namespace, "dead", "requeue", dead_id)
    assert code == 0, err
    assert "requeued 1 tasks" in out and f"dedup keys: {PROJECT_KEYS}" in out


def test_requeue_outside_a_project_keeps_canonical_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str,
        sync_redis: redis.Redis) -> None:
    monkeypatch.chdir(tmp_path)  # (no scrapy.cfg up the tree)
    dead_id = _dead(sync_redis, namespace, FIRST)
    code, out, err = run_cli(redis_url, namespace, "dead", "requeue", dead_id, "--json")
    assert code == 0 and err == ""
    assert json.loads(out)["dedup_keys"] == "canonical URL"
    assert _add(redis_url, namespace, [FIRST, SECOND]) == (1, 1)


@pytest.mark.parametrize("how", BROKEN)
def test_requeue_in_a_broken_project_warns_and_uses_canonical_keys(
        project: Enter, how: str, redis_url: str, namespace: str,
        sync_redis: redis.Redis) -> None:
    _broken(project, how)
    dead_id = _dead(sync_redis, namespace, FIRST)
    code, out, err = run_cli(redis_url, namespace, "dead", "requeue", dead_id, "--json")
    assert code == 0, err
    assert WARNING in err and "dedup keys: canonical URL" in err and "Traceback" not in err
    assert json.loads(out)["dedup_keys"] == "canonical URL"
    assert _add(redis_url, namespace, [FIRST]) == (0, 1)  # recorded under its canonical URL


# -- meteorseed serve ------------------------------------------------------------------------------

def _serve(monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str
           ) -> tuple[int, str, ApiConfig]:
    """``meteorseed serve`` run here, up to where it would listen: exit code, stderr, config."""
    configs: list[ApiConfig] = []

    async def listen(app: Any, host: str, port: int) -> None:
        configs.append(app[CONFIG])

    monkeypatch.setattr(serve_cli, "_serve", listen)
    monkeypatch.setenv("METEORSEED_API_TOKEN", TOKEN)
    out, err = io.StringIO(), io.StringIO()
    code = main(["serve", "--redis-url", redis_url, "--namespace", namespace],
                stdin=io.StringIO(), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return code, err.getvalue(), configs[0]


def test_serve_dispatches_looks_up_and_requeues_with_the_projects_keys(
        project: Enter, monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str,
        sync_redis: redis.Redis) -> None:
    project(CUSTOM)
    _, err, config = _serve(monkeypatch, redis_url, namespace)
    assert f"dedup keys: {PROJECT_KEYS}" in err
    assert global_object_name(type(config.fingerprinter)) == CUSTOM
    with ServerThread(config) as server:  # (the config `meteorseed serve` made, as it is)
        client = Client(server.url)
        status, _, first = client.call("POST", "/dispatch", url_list("s1", [FIRST]))
        assert status == 202 and (first["enqueued"], first["duplicates"]) == (1, 0)
        status, _, second = client.call("POST", "/dispatch", url_list("s2", [SECOND]))
        assert status == 202 and (second["enqueued"], second["duplicates"]) == (0, 1)
        # GET /tasks?url= with ?sid=2 finds the task of ?sid=1: one request to the project.
        quoted = urllib.parse.quote(SECOND, safe="")
        status, _, found = client.call("GET", f"/tasks?url={quoted}&site_id=news")
        assert status == 200 and found["state"] == "waiting", found
        assert found["query"]["dedup_keys"] == "REQUEST_FINGERPRINTER_CLASS"
        assert [p["task"]["url"] for p in found["places"]] == [FIRST]
        # POST requeue records the dead letter's URL under the project's key.
        dead_id = _dead(sync_redis, namespace, FIRST, site="shop")
        status, _, body = client.call("POST", f"/dead-letters/{dead_id}/requeue")
        assert status == 200 and body["requeued"]["id"] == dead_id
        status, _, third = client.call("POST", "/dispatch",
                                       url_list("s3", [SECOND], site_id="shop"))
        assert status == 202 and (third["enqueued"], third["duplicates"]) == (0, 1)


@pytest.mark.parametrize("how", BROKEN)
def test_serve_in_a_broken_project_warns_and_uses_canonical_keys(
        project: Enter, how: str, monkeypatch: pytest.MonkeyPatch, redis_url: str,
        namespace: str) -> None:
    _broken(project, how)
    _, err, config = _serve(monkeypatch, redis_url, namespace)
    assert WARNING in err and "dedup keys: canonical URL" in err and "Traceback" not in err
    assert config.fingerprinter is None


def test_the_fingerprinter_is_no_part_of_the_configs_value() -> None:
    plain = ApiConfig(redis_url="redis://127.0.0.1:1/0")
    keyed = ApiConfig(redis_url="redis://127.0.0.1:1/0", fingerprinter=IgnoreSession())
    assert plain == keyed and "fingerprinter" not in repr(keyed)


# -- meteorseed seeder -----------------------------------------------------------------------------

def _seeder_config(monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str
                   ) -> tuple[str, SeederConfig]:
    """``meteorseed seeder`` run here, up to where it would start watching: stderr, config."""
    configs: list[SeederConfig] = []

    async def watch(url: str, keys: KeyLayout, **kwargs: Any) -> int:
        configs.append(kwargs["config"])
        return 0

    monkeypatch.setattr(runner, "watch", watch)
    monkeypatch.setattr(runner, "log_to", lambda stream: None)  # (a handler for good otherwise)
    out, err = io.StringIO(), io.StringIO()
    code = main(["seeder", "--redis-url", redis_url, "--namespace", namespace],
                stdin=io.StringIO(), stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return err.getvalue(), configs[0]


def test_seeder_writes_with_the_projects_keys(
        project: Enter, monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str) -> None:
    project(CUSTOM)
    err, config = _seeder_config(monkeypatch, redis_url, namespace)
    assert global_object_name(type(config.fingerprinter)) == CUSTOM
    assert f"dedup keys: {PROJECT_KEYS}" in err
    assert _add(redis_url, namespace, [FIRST, SECOND], config.fingerprinter) == (1, 1)


@pytest.mark.parametrize("how", BROKEN)
def test_seeder_in_a_broken_project_warns_and_uses_canonical_keys(
        project: Enter, how: str, monkeypatch: pytest.MonkeyPatch, redis_url: str,
        namespace: str) -> None:
    _broken(project, how)
    err, config = _seeder_config(monkeypatch, redis_url, namespace)
    assert config.fingerprinter is None
    assert WARNING in err and "dedup keys: canonical URL" in err and "Traceback" not in err


# -- scrapy seed-expand --from-scrapy-redis ------------------------------------------------------

def _migrate(redis_url: str, namespace: str, settings: dict[str, Any],
             capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    opts = argparse.Namespace(from_scrapy_redis=namespace, site_id="news", seed_id=None,
                              move=False, dry_run=False, batch_size=100)
    code = run_migration(Settings(settings), redis_url, KeyLayout(namespace), opts, 0, redact)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("fingerprinter", "summary"), [
    (CUSTOM, "enqueued 1, duplicates 1"), (None, "enqueued 2, duplicates 0")])
def test_migration_keys_as_the_projects_workers(
        fingerprinter: str | None, summary: str, redis_url: str, namespace: str,
        sync_redis: redis.Redis, capsys: pytest.CaptureFixture[str]) -> None:
    # (the spider is named after the namespace, so the fixture cleans its keys up). Queued
    # requests, not start URLs: those are dont_filter in scrapy-redis, so never deduplicated.
    queued = [pickle.dumps(Request(url).to_dict(), protocol=-1) for url in (FIRST, SECOND)]
    sync_redis.rpush(f"{namespace}:requests", *queued)
    settings = {"REQUEST_FINGERPRINTER_CLASS": fingerprinter} if fingerprinter else {}
    code, out, err = _migrate(redis_url, namespace, settings, capsys)
    assert code == 0, err
    assert summary in out
    assert ("REQUEST_FINGERPRINTER_CLASS IgnoreSession" in err) == bool(fingerprinter)


def test_migration_refuses_a_fingerprinter_it_cannot_load(
        redis_url: str, namespace: str, sync_redis: redis.Redis,
        capsys: pytest.CaptureFixture[str]) -> None:
    sync_redis.rpush(f"{namespace}:start_urls", FIRST)
    code, _, err = _migrate(redis_url, namespace,
                            {"REQUEST_FINGERPRINTER_CLASS": "fpproject.nowhere.Nothing"}, capsys)
    assert code != 0 and "REQUEST_FINGERPRINTER_CLASS" in err and "Traceback" not in err
    assert sync_redis.llen(f"{namespace}:start_urls") == 1  # nothing migrated, nothing lost
    assert _add(redis_url, namespace, [FIRST]) == (1, 0)  # nor recorded

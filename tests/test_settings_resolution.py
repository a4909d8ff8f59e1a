"""One order of precedence for every METEORSEED_* setting, the same in a worker (`scrapy crawl`),
`scrapy seed-expand` and `meteorseed`: options > -s > environment > settings.py > defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy.settings import Settings

from meteorseed_scrapy.addon import MeteorSeedAddon
from meteorseed_scrapy.cli.common import resolve_target
from meteorseed_scrapy.settings import (
    ENV_PRIORITY,
    apply_environment,
    environment_settings,
    integer_setting,
    redis_url_and_source,
    setting,
)
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import PROJECT, REPO, stored_docs
from tests.subprocess_env import python_path

MEMBERS = "METEORSEED_MAX_BACKLOG"


def _settings(project: Any = None, cmdline: Any = None) -> Settings:
    settings = Settings()
    if project is not None:
        settings.set(MEMBERS, project, priority="project")
    if cmdline is not None:
        settings.set(MEMBERS, cmdline, priority="cmdline")
    return settings


@pytest.mark.parametrize(("project", "env", "cmdline", "expected"), [
    (None, None, None, 1_000_000),  # the default
    (7, None, None, 7),  # settings.py
    (7, "8", None, 8),  # the environment over settings.py
    (7, "8", 9, 9),  # -s over the environment
    (None, "8", None, 8),
    (None, "", None, 1_000_000),  # an empty variable is unset
])
def test_the_order_is_the_same_through_the_accessor_and_in_the_settings(
        project: Any, env: str | None, cmdline: Any, expected: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if env is not None:
        monkeypatch.setenv(MEMBERS, env)
    # A component reading settings the add-on never touched (pieces set by hand)...
    assert integer_setting(_settings(project, cmdline), MEMBERS) == expected
    # ...and the add-on's settings, read by anyone, directly too.
    settings = _settings(project, cmdline)
    MeteorSeedAddon().update_settings(settings)
    assert integer_setting(settings, MEMBERS) == expected
    assert settings.getint(MEMBERS) == expected


def test_a_spiders_custom_settings_sit_below_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMBERS, "8")
    settings = Settings()
    settings.set(MEMBERS, 5, priority="spider")
    apply_environment(settings)
    assert settings.getpriority(MEMBERS) == ENV_PRIORITY and settings.getint(MEMBERS) == 8


def test_a_mapping_or_getter_is_filled_in_from_the_environment_where_it_is_silent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMBERS, "8")
    assert setting({}, MEMBERS) == "8" and setting({MEMBERS: 3}.get, MEMBERS) == 3


def test_variables_that_are_not_settings_stay_out() -> None:
    env = {"METEORSEED_API_TOKEN": "secret", "METEORSEED_REDIS_SERVER": "/bin/x",
           "METEORSEED_TEST_MONGO_URL": "mongodb://x", "METEORSEED_NAMESPACE": "n",
           "REDIS_URL": "redis://elsewhere", "METEORSEED_CONSUMER": ""}
    assert environment_settings(env) == {"METEORSEED_NAMESPACE": "n"}


def test_the_redis_url_says_it_came_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METEORSEED_REDIS_URL", "redis://from-env:1/0")
    settings = Settings({"METEORSEED_REDIS_URL": "redis://from-project:1/0"}, priority="project")
    assert redis_url_and_source(settings) == ("redis://from-env:1/0", "env METEORSEED_REDIS_URL")
    settings.set("METEORSEED_REDIS_URL", "redis://from-s:1/0", priority="cmdline")
    assert redis_url_and_source(settings) == ("redis://from-s:1/0", "METEORSEED_REDIS_URL")


def test_cli_options_come_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no Scrapy project here
    monkeypatch.setenv("METEORSEED_NAMESPACE", "from-env")
    monkeypatch.setenv("METEORSEED_REDIS_URL", "redis://from-env:1/0")
    assert resolve_target(None, None) == ("redis://from-env:1/0", "from-env")
    assert resolve_target("redis://opt:1/0", "opt") == ("redis://opt:1/0", "opt")


# -- the three programs, for real ---------------------------------------------------------------

@pytest.fixture
def env_only(tmp_path: Path, redis_url: str) -> Iterator[dict[str, str]]:
    """An environment naming the Redis, a fresh namespace and the store; nothing else does
    (the probe project's settings.py names none of them, and no -s is given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("METEORSEED_")}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    env.update(PYTHONPATH=python_path(REPO, PROJECT),
               METEORSEED_REDIS_URL=redis_url, METEORSEED_NAMESPACE=f"envns{uuid.uuid4().hex[:8]}",
               METEORSEED_STORE_URI=f"sqlite:///{tmp_path / 'items.db'}")
    yield env


def _run(args: list[str], env: dict[str, str], timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=PROJECT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _status(env: dict[str, str]) -> dict[str, Any]:
    done = _run([sys.executable, "-c", "import sys; from meteorseed_scrapy.cli import main; "
                 "sys.exit(main())", "status", "--json"], env)
    assert done.returncode == 0, done.stderr
    status: dict[str, Any] = json.loads(done.stdout)
    return status


def test_a_namespace_given_only_in_the_environment_is_the_one_all_three_use(
        env_only: dict[str, str], tmp_path: Path, sync_redis: redis.Redis,
        demo_site: DemoSite) -> None:
    namespace = env_only["METEORSEED_NAMESPACE"]
    urls = [f"{demo_site.url}/news/article/{i}" for i in range(1, 4)]
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(json.dumps({"seed_id": "s1", "site_id": "probe", "task_type": "url_list",
                                 "payload": {"urls": urls}}) + "\n")
    expanded = _run([sys.executable, "-m", "scrapy.cmdline", "seed-expand", str(seeds)], env_only)
    assert expanded.returncode == 0, expanded.stderr
    assert "enqueued 3" in expanded.stdout
    assert sync_redis.keys(f"{namespace}:*")  # seed-expand wrote to the env's namespace

    status = _status(env_only)
    assert status["namespace"] == namespace and status["backlog"] == 3

    log = tmp_path / "worker.log"
    crawled = _run([sys.executable, "-m", "scrapy.cmdline", "crawl", "probe",
                    "-s", "METEORSEED_IDLE_CLOSE=2", "-s", f"LOG_FILE={log}"], env_only)
    assert crawled.returncode == 0, log.read_text()[-3000:]
    assert "(from env METEORSEED_REDIS_URL)" in log.read_text()
    assert len(stored_docs(tmp_path / "items.db")) == 3  # the env's store too
    assert _status(env_only)["backlog"] == 0

"""What the add-on does with a project's settings: misspelt METEORSEED_* names are named, an
invalid value ends the crawl with one line (no traceback), the project's own component
priorities win."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from meteorseed_scrapy import settings as settings_module
from meteorseed_scrapy.addon import MeteorSeedAddon
from meteorseed_scrapy.pipelines import UpsertPipeline
from meteorseed_scrapy.politeness.robotstxt import RobotsTxtMiddleware
from meteorseed_scrapy.setting_checks import TEXT, InvalidSettings, check_settings
from meteorseed_scrapy.settings import DEFAULTS, unknown_settings
from meteorseed_scrapy.validators import ConfigError
from tests.e2e_helpers import PROJECT, REPO
from tests.subprocess_env import python_path

SCRAPY_ROBOTS = "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware"


def _addon(**project: Any) -> Settings:
    settings = Settings()
    settings.setdict(project, priority="project")
    MeteorSeedAddon().update_settings(settings)
    return settings


def _orders(settings: Settings, name: str) -> dict[Any, Any]:
    return {load_object(k): v for k, v in settings.getdict(name).items()}


# -- unknown names -----------------------------------------------------------------------------

def test_a_misspelt_name_is_named_with_the_closest_setting() -> None:
    assert unknown_settings(["METEORSEED_CLAIM_IDEL", "METEORSEED_SITE_RATES", "DOWNLOAD_DELAY",
                             "METEORSEED_NAMESPACE", "METEORSEED_API_TOKEN"]) == [
        "unknown setting METEORSEED_CLAIM_IDEL, ignored; did you mean METEORSEED_CLAIM_IDLE?",
        "unknown setting METEORSEED_SITE_RATES, ignored; did you mean METEORSEED_SITE_RATE?",
    ]
    assert unknown_settings(["METEORSEED_QQQQQQQQQQQQQQQQQQQ"]) == [
        "unknown setting METEORSEED_QQQQQQQQQQQQQQQQQQQ, ignored"]


@pytest.mark.parametrize("source", ["project", "cmdline", "env"])
def test_the_addon_warns_once_about_a_misspelt_name_from_any_source(
        source: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_module, "_WARNED", set())
    name = "METEORSEED_CLAIM_IDEL"
    settings = Settings()
    if source == "env":
        monkeypatch.setenv(name, "5")
    else:
        settings.set(name, 5, priority=source)
    with caplog.at_level(logging.WARNING, logger="meteorseed_scrapy.addon"):
        MeteorSeedAddon().update_settings(settings)
        MeteorSeedAddon().update_settings(settings)  # a second crawler in the same process
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert lines == [f"unknown setting {name}, ignored; did you mean METEORSEED_CLAIM_IDLE?"]


# -- invalid values ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(set(DEFAULTS) - TEXT - {"METEORSEED_NAMESPACE"}))
def test_every_non_text_setting_is_checked_up_front(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_settings(Settings({name: "nonsense!"}))
    assert info.value.name in (name, "METEORSEED_SCHEDULE_MIN_INTERVAL")


def test_the_addon_refuses_an_invalid_value_as_a_config_error_and_an_exit() -> None:
    with pytest.raises(InvalidSettings) as info:
        _addon(METEORSEED_SITE_RATE="fast")
    assert isinstance(info.value, ConfigError) and isinstance(info.value, SystemExit)
    assert info.value.name == "METEORSEED_SITE_RATE" and info.value.code == 2


def _crawl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("METEORSEED_")}
    environ.pop("SCRAPY_SETTINGS_MODULE", None)
    environ.update(PYTHONPATH=python_path(REPO, PROJECT), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", *args,
         "-s", "METEORSEED_REDIS_URL=redis://127.0.0.1:9/0"],
        cwd=PROJECT, env=environ, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("args", "env"), [
    (["-s", "METEORSEED_CLAIM_IDLE=abc"], {}),
    ([], {"METEORSEED_CLAIM_IDLE": "abc"}),
    (["-s", "METEORSEED_STORE_BATCH_SIZE=0"], {}),
    (["-s", "METEORSEED_LOG_JSON=perhaps", "-s", "LOG_FILE=/dev/null"], {}),
])
def test_an_invalid_value_ends_scrapy_crawl_with_one_line(
        args: list[str], env: dict[str, str]) -> None:
    done = _crawl("crawl", "probe", *args, env=env)
    name = (args[1] if args else next(iter(env))).split("=")[0]
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"Invalid setting, the crawl cannot start: {name}: " in done.stderr
    assert "Traceback" not in done.stderr and "Engine slot" not in done.stderr
    assert "Spider opened" not in done.stderr  # refused before the engine was built


def test_an_invalid_value_ends_seed_expand_and_the_cli_with_one_line(tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("")
    env = {"METEORSEED_MAX_BACKLOG": "-5"}
    done = _crawl("seed-expand", str(seeds), env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "invalid setting METEORSEED_MAX_BACKLOG: must be >= 0" in done.stderr
    environ = {k: v for k, v in os.environ.items() if not k.startswith("METEORSEED_")}
    cli = subprocess.run(
        [sys.executable, "-c", "import sys; from meteorseed_scrapy.cli import main; "
         "sys.exit(main())", "status"], cwd=PROJECT, capture_output=True, text=True,
        env={**environ, "PYTHONPATH": python_path(REPO), **env}, timeout=60, check=False)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr, cli.stderr
    assert cli.stderr.strip() == (
        "meteorseed: invalid setting METEORSEED_MAX_BACKLOG: must be >= 0, got '-5'")


# -- component priorities ----------------------------------------------------------------------

def test_the_addon_adds_its_components_at_its_orders() -> None:
    settings = _addon()
    assert _orders(settings, "ITEM_PIPELINES") == {UpsertPipeline: 900}
    middlewares = _orders(settings, "DOWNLOADER_MIDDLEWARES")
    assert middlewares[RobotsTxtMiddleware] == 100 and middlewares[load_object(SCRAPY_ROBOTS)] \
        is None
    # What Scrapy builds from it (on Scrapy 2.14 a class key did not override the base's path
    # key: Scrapy's robots.txt middleware ran beside ours, each fetching robots.txt).
    built = [load_object(path) for path in build_component_list(
        settings.getwithbase("DOWNLOADER_MIDDLEWARES"))]
    assert RobotsTxtMiddleware in built and load_object(SCRAPY_ROBOTS) not in built


def test_a_projects_own_priorities_for_our_components_win() -> None:
    settings = _addon(
        ITEM_PIPELINES={"meteorseed_scrapy.pipelines.UpsertPipeline": 300, "x.Mine": 950},
        DOWNLOADER_MIDDLEWARES={"meteorseed_scrapy.middlewares.SiteSlotMiddleware": None,
                                "meteorseed_scrapy.politeness.proxies.ProxyPoolMiddleware": 745})
    assert settings.getdict("ITEM_PIPELINES") == {
        "meteorseed_scrapy.pipelines.UpsertPipeline": 300, "x.Mine": 950}
    middlewares = _orders(settings, "DOWNLOADER_MIDDLEWARES")
    assert middlewares[load_object("meteorseed_scrapy.middlewares.SiteSlotMiddleware")] is None
    assert middlewares[load_object(
        "meteorseed_scrapy.politeness.proxies.ProxyPoolMiddleware")] == 745


def test_a_project_placing_scrapys_robots_middleware_gets_ours_there() -> None:
    middlewares = _orders(_addon(DOWNLOADER_MIDDLEWARES={SCRAPY_ROBOTS: 120}),
                          "DOWNLOADER_MIDDLEWARES")
    assert middlewares[RobotsTxtMiddleware] == 120
    assert middlewares[load_object(SCRAPY_ROBOTS)] is None  # not Scrapy's base 100 either


def test_seed_expand_and_the_cli_name_a_misspelt_variable_too(tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("")
    env = {"METEORSEED_NAMESPAC": "typo", "METEORSEED_MAX_BACKLOG": "-5"}  # then refused
    hint = "unknown setting METEORSEED_NAMESPAC, ignored; did you mean METEORSEED_NAMESPACE?"
    assert hint in _crawl("seed-expand", str(seeds), env=env).stderr
    environ = {k: v for k, v in os.environ.items() if not k.startswith("METEORSEED_")}
    cli = subprocess.run(
        [sys.executable, "-c", "import sys; from meteorseed_scrapy.cli import main; "
         "sys.exit(main())", "status"], cwd=PROJECT, capture_output=True, text=True,
        env={**environ, "PYTHONPATH": python_path(REPO), **env}, timeout=60, check=False)
    assert f"meteorseed: warning: {hint}" in cli.stderr.splitlines()


@pytest.mark.parametrize(("name", "value"), [
    ("CONCURRENT_REQUESTS", "many"), ("CONCURRENT_REQUESTS", -1), ("RETRY_TIMES", "x"),
    ("RETRY_TIMES", -1), ("REDIRECT_MAX_TIMES", 2.5), ("RETRY_HTTP_CODES", "500,5xx"),
])
def test_a_scrapy_count_the_addon_reads_is_checked_up_front_naming_it(name: str,
                                                                      value: object) -> None:
    # (on stock Scrapy the first, third and last fail later, as a bare ValueError: "invalid
    # literal for int() with base 10")
    with pytest.raises(ConfigError) as info:
        check_settings(Settings({name: value}))
    assert info.value.name == name
    # (0, Scrapy's "no limit", passes here: a local crawl takes it as Scrapy does, and a worker
    # crawl refuses it when it opens, test_scrapy_commands.py)
    check_settings(Settings({"RETRY_HTTP_CODES": "500,502", "RETRY_TIMES": "3",
                             "CONCURRENT_REQUESTS": 0}))


def test_an_invalid_scrapy_setting_the_addon_reads_is_refused_the_same_way() -> None:
    done = _crawl("crawl", "probe", "-s", "AUTOTHROTTLE_ENABLED=maybe")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Invalid setting, the crawl cannot start: AUTOTHROTTLE_ENABLED: " in done.stderr

"""`scrapy crawl sites` in a project made by `scrapy startproject`, with the add-on and a rules
directory, and nothing added to SPIDER_MODULES."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scrapy.settings import Settings

from meteorseed_scrapy.addon import SITES_SPIDER_MODULE, MeteorSeedAddon
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import REPO, enqueue, stored_docs
from tests.subprocess_env import python_path

ADDON = 'ADDONS = {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}'


def _modules(**given: object) -> list[str]:
    settings = Settings({"SPIDER_MODULES": ["mine.spiders"], **given}, priority="project")
    MeteorSeedAddon.update_pre_crawler_settings(settings)
    return settings.getlist("SPIDER_MODULES")


def test_the_rule_spider_is_listed_first_when_the_project_has_rule_sites(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("METEORSEED_SITES_DIR", raising=False)
    assert _modules() == ["mine.spiders"]  # no rule sites: nothing added
    assert _modules(METEORSEED_SITES_DIR="sites") == [SITES_SPIDER_MODULE, "mine.spiders"]
    assert _modules(METEORSEED_SITES_REDIS=True)[0] == SITES_SPIDER_MODULE
    assert _modules(METEORSEED_SITES_DIR="s", SPIDER_MODULES=["a", SITES_SPIDER_MODULE]) == [
        "a", SITES_SPIDER_MODULE]  # listed by hand already: left alone
    monkeypatch.setenv("METEORSEED_SITES_DIR", "sites")
    assert _modules()[0] == SITES_SPIDER_MODULE  # from the environment too


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scrapy.cmdline", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_scrapy_crawl_sites_in_a_fresh_project(
        tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METEORSEED_")}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    env["PYTHONPATH"] = python_path(REPO)
    made = _run(["startproject", "myproject"], tmp_path, env)
    assert made.returncode == 0, made.stderr
    project = tmp_path / "myproject"
    settings = project / "myproject" / "settings.py"
    text = settings.read_text()
    assert "ADDONS = {}" in text  # the template's line, as the README's install steps say
    settings.write_text(text.replace("ADDONS = {}", ADDON))
    shutil.copytree(REPO / "example_project" / "sites", tmp_path / "rules")
    env.update(METEORSEED_SITES_DIR=str(tmp_path / "rules"), METEORSEED_REDIS_URL=redis_url,
               METEORSEED_NAMESPACE=namespace,
               METEORSEED_STORE_URI=f"sqlite:///{tmp_path / 'items.db'}")

    # (`scrapy list` builds its spider loader without the add-ons' pre-crawler settings, so
    # it does not show the rule spider: Scrapy's command, not checked here.)
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/12"], site_id="example_news",
            callback="parse_detail")
    crawled = _run(["crawl", "sites", "-s", "METEORSEED_IDLE_CLOSE=2"], project, env)
    assert crawled.returncode == 0, crawled.stderr[-4000:]
    assert "Spider not found" not in crawled.stderr
    assert stored_docs(tmp_path / "items.db")["example_news:12"]["article_id"] == 12

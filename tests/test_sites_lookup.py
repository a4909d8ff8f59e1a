"""One site-rule lookup (sites.lookup.SiteConfigs) for workers, seeding and the API, and the
import rules of the sites package: below politeness/worker/api, no cycle inside it."""

from __future__ import annotations

import ast
import asyncio
import io
import threading
from pathlib import Path

import pytest
import redis
import yaml

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import sync_client
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.sites.remote import RemoteRules

PACKAGE = Path(__file__).resolve().parents[1] / "meteorseed_scrapy"


def _layers_from(name: str) -> set[str]:
    """``name`` and the layers below it, as pyproject.toml's import-linter contract lists them
    (read from there, so that a layer added below does not need a second list here)."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+; this suite runs on 3.11)
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    layers = config["tool"]["importlinter"]["contracts"][0]["layers"]
    flat = [part.strip() for layer in layers for part in layer.split(":")]
    return set(flat[flat.index(name):])




def project_imports(path: Path) -> set[str]:
    """Every ``meteorseed_scrapy.*`` module ``path`` imports, at any depth (function-local
    and ``TYPE_CHECKING`` imports too: they hide cycles, they do not remove them)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in ("meteorseed_scrapy", "meteorseed_scrapy.sites"):  # import x
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif node.module.startswith("meteorseed_scrapy"):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("meteorseed_scrapy"))
    return found


def module_of(path: Path) -> str:
    return ".".join(("meteorseed_scrapy", *path.relative_to(PACKAGE).with_suffix("").parts))


def test_sites_imports_only_the_layers_below_it() -> None:
    bad = {f"{module_of(path)} -> {name}"
           for path in sorted((PACKAGE / "sites").glob("*.py"))
           for name in project_imports(path)
           if name.split(".")[1] not in _layers_from("sites")}
    assert not bad  # e.g. sites.render must not reach politeness/ or worker/


def test_no_import_cycle_inside_sites() -> None:
    graph = {module_of(p): {m for m in project_imports(p)
                            if m.startswith("meteorseed_scrapy.sites.")}
             for p in (PACKAGE / "sites").glob("*.py")}
    done: set[str] = set()

    def visit(module: str, trail: tuple[str, ...]) -> None:
        assert module not in trail, " -> ".join((*trail[trail.index(module):], module))
        if module in done:
            return
        for name in sorted(graph.get(module, ())):
            visit(name, (*trail, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


@pytest.mark.parametrize("package", ["seeding", "sites", "politeness"])
def test_no_site_rule_lookup_reached_through_the_api(package: str) -> None:
    users = {module_of(p) for p in (PACKAGE / package).glob("*.py")
             if any(name.startswith("meteorseed_scrapy.api") for name in project_imports(p))}
    assert not users
    assert not (PACKAGE / "api" / "rules.py").exists()  # its SiteRules is SiteConfigs now


RULES = {"site_id": "news", "version": 1, "start": "detail", "fields": {"title": "h1::text"},
         "allowed_domains": ["news.test"], "blacklist": ["/login"]}


def test_rejects_names_the_blacklist_pattern_or_the_allowed_domains(tmp_path: Path) -> None:
    (tmp_path / "news.yaml").write_text(yaml.safe_dump(RULES))
    sites = SiteConfigs(tmp_path)
    asyncio.run(sites.refresh())
    assert sites.rejects("news", "https://www.news.test/a") is None
    assert "blacklist pattern '/login'" in str(sites.rejects("news", "https://news.test/login"))
    assert "not in the allowed domains of site news (news.test)" in str(
        sites.rejects("news", "https://elsewhere.test/a"))
    assert sites.rejects("unknown", "https://elsewhere.test/a") is None
    assert SiteConfigs().sites == {} and SiteConfigs().get("news") is None


def test_a_refresh_during_the_first_read_waits_for_its_rules(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's first dispatch may come while a background refresh (its history sampling)
    still reads the rules in a thread: it must not check URLs against no rules at all."""
    (tmp_path / "news.yaml").write_text(yaml.safe_dump(RULES))
    sites = SiteConfigs(tmp_path)
    registry = sites._registry
    reading, release = threading.Event(), threading.Event()
    poll = registry.poll

    def slow_poll() -> object:
        reading.set()
        assert release.wait(30)
        return poll()

    monkeypatch.setattr(registry, "poll", slow_poll)

    async def race() -> str | None:
        first = asyncio.create_task(sites.refresh())
        assert await asyncio.to_thread(reading.wait, 30)  # the first read is under way
        second = asyncio.create_task(sites.refresh())
        await asyncio.sleep(0)  # (the second refresh runs up to its first wait)
        release.set()
        await second
        verdict = sites.rejects("news", "https://elsewhere.test/a")
        await first
        return verdict

    assert "not in the allowed domains" in str(asyncio.run(race()))


def test_a_missing_directory_is_warned_about_once_and_read_once_it_exists(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sites = SiteConfigs(tmp_path / "later", interval=0)
    asyncio.run(sites.refresh())
    assert sites.sites == {}
    assert caplog.text.count("is not a directory") == 1
    (tmp_path / "later").mkdir()
    (tmp_path / "later" / "news.yaml").write_text(yaml.safe_dump(RULES))
    sites._polled = 0.0  # as if a second had passed (the missing directory's retry period)
    asyncio.run(sites.refresh())
    assert set(sites.sites) == {"news"}
    assert caplog.text.count("is not a directory") == 1


def test_rules_pushed_to_redis_and_local_files_in_one_lookup(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    pushed = tmp_path / "pushed"
    pushed.mkdir()
    (pushed / "shop.yaml").write_text(yaml.safe_dump({**RULES, "site_id": "shop"}))
    out, err = io.StringIO(), io.StringIO()
    assert main(["sites", "push", str(pushed), "--redis-url", redis_url, "--namespace",
                 namespace], stdin=io.StringIO(), stdout=out, stderr=err) == 0, err.getvalue()
    local = tmp_path / "local"
    local.mkdir()
    (local / "news.yaml").write_text(yaml.safe_dump(RULES))
    client = sync_client(redis_url, decode_responses=True)
    try:
        sites = SiteConfigs(local, RemoteRules(client, keys), interval=0)
        asyncio.run(sites.refresh())
        assert set(sites.sites) == {"news", "shop"}
        assert sites.rejects("shop", "https://elsewhere.test/") is not None
    finally:
        client.close()

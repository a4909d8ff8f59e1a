"""Site rule files through Redis: ``meteorseed sites push``, workers' reload, last good kept."""

from __future__ import annotations

import io
import itertools
import json
import logging
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import redis
from e2e_helpers import enqueue, stored_docs
from test_sites_e2e import enqueue_details, finish, start_sites_worker

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import free_port
from meteorseed_scrapy.testing.sites import DemoSite

REPO = Path(__file__).resolve().parents[1]
SITES = REPO / "example_project" / "sites"


def sites_cli(redis_url: str, namespace: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["sites", argv[0], "--redis-url", redis_url, "--namespace", namespace,
                 *argv[1:]], stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    target = tmp_path / "rules"
    shutil.copytree(SITES, target)
    return target


def bump(path: Path, version: int) -> None:
    path.write_text(path.read_text().replace("version: 1", f"version: {version}", 1))


def test_push_list_rm(redis_url: str, namespace: str, sync_redis: redis.Redis,
                      rules: Path) -> None:
    code, out, err = sites_cli(redis_url, namespace, "push", str(rules))
    assert code == 0, err
    assert "pushed example_news version 1 (news.yaml)" in out
    assert out.splitlines()[-1].startswith(f"4 sites in {namespace}:sites at ")
    stored = json.loads(sync_redis.hget(f"{namespace}:sites", "example_shop") or "")
    assert stored["text"] == (rules / "shop.yaml").read_text() and stored["version"] == "1"
    assert sync_redis.get(f"{namespace}:sites:rev") == "1"
    code, out, _ = sites_cli(redis_url, namespace, "list", "--json")
    listed = json.loads(out)
    assert sorted(listed) == ["example_jobs", "example_news", "example_quotes", "example_shop"]
    assert listed["example_jobs"]["source"] == "jobs.json" and "text" not in listed["example_jobs"]
    code, out, _ = sites_cli(redis_url, namespace, "list")
    assert out.splitlines()[0].split() == ["SITE", "VERSION", "SOURCE", "PUSHED_AT", "ERROR"]
    (rules / "jobs.json").unlink()
    code, out, _ = sites_cli(redis_url, namespace, "push", str(rules), "--prune")
    assert code == 0 and "removed example_jobs" in out
    assert sync_redis.hlen(f"{namespace}:sites") == 3
    assert sites_cli(redis_url, namespace, "rm", "example_shop", "nope")[0] == 1
    assert sync_redis.hkeys(f"{namespace}:sites") != [] and not sync_redis.hexists(
        f"{namespace}:sites", "example_shop")
    assert sync_redis.get(f"{namespace}:sites:rev") == "3"


def test_push_validates_everything_and_stores_nothing_on_error(
        redis_url: str, namespace: str, sync_redis: redis.Redis, rules: Path) -> None:
    news = rules / "news.yaml"
    news.write_text(news.read_text().replace('"h1.title::text"', '"h1[["'))
    (rules / "copy.yaml").write_text((rules / "shop.yaml").read_text())
    code, out, err = sites_cli(redis_url, namespace, "push", str(rules))
    assert code == 1 and out == ""
    assert f"{rules}: <top>: nothing pushed:" in err
    assert f"{news}: fields.title.css: invalid selector" in err
    assert "site_id: 'example_shop' is already defined in" in err
    assert sync_redis.exists(f"{namespace}:sites", f"{namespace}:sites:rev") == 0
    assert sites_cli(redis_url, namespace, "push", str(rules / "missing"))[0] == 1


def test_registry_reloads_pushed_rules_and_keeps_the_last_good_version(
        redis_url: str, namespace: str, sync_redis: redis.Redis, rules: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    keys = KeyLayout(namespace)
    remote = RemoteRules.from_url(redis_url, keys)
    registry = SiteRegistry(None, remote=remote).load()
    assert registry.sites == {}
    assert sites_cli(redis_url, namespace, "push", str(rules))[0] == 0
    registry.apply(registry.poll())
    assert registry.get("example_news").version == "1"  # type: ignore[union-attr]
    assert registry.poll() == []  # rev unchanged: one GET, nothing re-read
    bump(rules / "news.yaml", 2)
    assert sites_cli(redis_url, namespace, "push", str(rules))[0] == 0
    changed = registry.poll()
    assert [r.config.site_id for r in changed if r.config] == ["example_news"]
    registry.apply(changed)
    assert registry.get("example_news").version == "2"  # type: ignore[union-attr]
    # A record that does not validate on the worker never replaces the good version.
    record = json.loads(sync_redis.hget(keys.sites, "example_news") or "")
    record["text"] = record["text"].replace("version: 2", "version: 3\npagnation: x")
    sync_redis.hset(keys.sites, "example_news", json.dumps(record))
    sync_redis.incr(keys.sites_rev)
    with caplog.at_level(logging.ERROR):
        registry.apply(registry.poll())
    assert registry.get("example_news").version == "2"  # type: ignore[union-attr]
    assert "keeping the last good version 2 of site example_news" in caplog.text
    assert "pagnation: unknown key" in caplog.text
    sync_redis.hdel(keys.sites, "example_shop")
    sync_redis.incr(keys.sites_rev)
    registry.apply(registry.poll())
    assert registry.get("example_shop") is None and registry.get("example_jobs") is not None
    registry.close()


def test_registry_keeps_its_sites_while_redis_is_unreachable(
        redis_url: str, namespace: str, rules: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert sites_cli(redis_url, namespace, "push", str(rules))[0] == 0
    registry = SiteRegistry(None, remote=RemoteRules.from_url(redis_url, KeyLayout(namespace)))
    registry.load()
    registry.remote = RemoteRules.from_url(f"redis://127.0.0.1:{free_port()}/0",
                                           KeyLayout(namespace))
    with caplog.at_level(logging.WARNING):
        assert registry.poll() == []
    assert len(registry.sites) == 4
    assert "Cannot read the site rules pushed to Redis" in caplog.text


@pytest.mark.e2e
def test_a_worker_crawls_with_pushed_rules_and_picks_up_a_new_push(
        tmp_path: Path, redis_url: str, namespace: str, rules: Path,
        demo_site: DemoSite) -> None:
    assert sites_cli(redis_url, namespace, "push", str(rules))[0] == 0
    empty = tmp_path / "no-files"
    empty.mkdir()
    proc = start_sites_worker(tmp_path, redis_url, namespace, empty, idle_close=0,
                              settings={"METEORSEED_SITES_REDIS": True})
    try:
        enqueue(redis_url, namespace, [f"{demo_site.url}/shop/category/1"],
                site_id="example_shop")
        wait_for(lambda: len(stored_docs(tmp_path / "items.db")) == 10, timeout=60)
        bump(rules / "news.yaml", 2)
        assert sites_cli(redis_url, namespace, "push", str(rules))[0] == 0
        ids = itertools.count(1)

        def reloaded() -> Any:
            enqueue_details(redis_url, namespace, [f"{demo_site.url}/news/article/{next(ids)}"])
            return any(d.get("rule_version") == "2" for d in
                       stored_docs(tmp_path / "items.db").values())

        wait_for(reloaded, timeout=30, interval=0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
    log = finish(proc, tmp_path)
    assert f"Loaded site example_news version 1 from redis:{namespace}:sites/example_news" in log
    assert "Reloaded site example_news: version 2 (was 1)" in log


def test_a_push_of_the_same_rules_later_changes_nothing_on_the_workers(
        redis_url: str, namespace: str, sync_redis: redis.Redis, rules: Path) -> None:
    # The record carries pushed_at (to the second): a second push of unchanged files must not
    # make every worker re-read and re-apply every site.
    keys = KeyLayout(namespace)
    registry = SiteRegistry(None, remote=RemoteRules.from_url(redis_url, keys)).load()
    assert sites_cli(redis_url, namespace, "push", str(rules))[0] == 0
    registry.apply(registry.poll())
    for site_id, value in sync_redis.hgetall(keys.sites).items():
        record = json.loads(value)
        record["pushed_at"] = "2999-01-01T00:00:00Z"
        sync_redis.hset(keys.sites, site_id, json.dumps(record))
    sync_redis.incr(keys.sites_rev)
    assert registry.poll() == []

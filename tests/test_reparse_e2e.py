"""`meteorseed sites reparse`: a real `scrapy crawl sites` worker fills the page cache from a
local site that counts its requests; the rules change; the re-parse upserts the new fields
with 0 requests to the site, keeps identities and first_seen_at, and reports a corrupted
cache entry without losing the rest. A cache that cannot be written never costs an item. And
reposts across sites with real workers: two sites publishing the same articles."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import enqueue, stored_docs
from test_sites_e2e import PROJECT, finish, start_sites_worker

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.testing.metered_site import MeteredSite

pytestmark = pytest.mark.e2e


@pytest.fixture
def site() -> Iterator[MeteredSite]:
    with MeteredSite() as served:
        yield served


@pytest.fixture
def sites_dir(tmp_path: Path) -> Path:
    target = tmp_path / "sites"
    target.mkdir()
    shutil.copy(PROJECT / "sites" / "news.yaml", target)
    return target


def crawl(tmp_path: Path, redis_url: str, namespace: str, sites_dir: Path, site: MeteredSite,
          **settings: Any) -> tuple[dict[str, dict[str, Any]], str]:
    enqueue(redis_url, namespace, [f"{site.url}/news/list/1"], site_id="example_news")
    log = finish(start_sites_worker(tmp_path, redis_url, namespace, sites_dir,
                                    settings={"METEORSEED_PAGE_CACHE": True, **settings}),
                 tmp_path)
    return stored_docs(tmp_path / "items.db"), log


def reparse(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str, namespace: str,
            sites_dir: Path, *args: str, site_id: str = "example_news"
            ) -> tuple[int, dict[str, Any]]:
    monkeypatch.chdir(tmp_path)  # (no scrapy.cfg up the tree: settings from the environment)
    monkeypatch.setenv("METEORSEED_STORE_URI", f"sqlite:///{tmp_path / 'items.db'}")
    monkeypatch.setenv("METEORSEED_NAMESPACE", namespace)
    monkeypatch.setenv("METEORSEED_REDIS_URL", redis_url)
    out, err = io.StringIO(), io.StringIO()
    code = main(["sites", "reparse", site_id, "--sites-dir", str(sites_dir), "--json",
                 *args], stdout=out, stderr=err)
    assert out.getvalue(), err.getvalue()
    return code, json.loads(out.getvalue())


def test_reparse_runs_new_rules_over_cached_pages_without_a_request(
        tmp_path: Path, redis_url: str, namespace: str, sites_dir: Path, site: MeteredSite,
        monkeypatch: pytest.MonkeyPatch) -> None:
    before, _ = crawl(tmp_path, redis_url, namespace, sites_dir, site)
    assert len(before) == 50
    fetched = site.meter(reset=True)["requests"]
    with sqlite3.connect(tmp_path / "items.db") as conn:
        cached = conn.execute("SELECT COUNT(*) FROM pages WHERE namespace = ?",
                              (namespace,)).fetchone()[0]
        assert cached == fetched  # every page the site served (list and article pages)
        # One entry torn in half: reported, the other pages still re-parsed.
        torn = conn.execute("SELECT key, data FROM pages WHERE namespace = ? AND key IN (SELECT"
                            " key FROM pages ORDER BY fetched_at DESC LIMIT 1)",
                            (namespace,)).fetchone()
        conn.execute("UPDATE pages SET data = ? WHERE key = ?", (torn[1][:len(torn[1]) // 2],
                                                                 torn[0]))
    rules = (sites_dir / "news.yaml").read_text()
    (sites_dir / "news.yaml").write_text(
        rules.replace("version: 1", "version: 2").replace(
            "fields:\n", 'fields:\n  headline: {css: "h1.title::text"}\n', 1))

    code, result = reparse(monkeypatch, tmp_path, redis_url, namespace, sites_dir)

    assert site.meter()["requests"] == 0
    assert result["requests_sent"] == 0 and result["unreadable"] == 1 and code == 1
    assert "truncated" in result["problems"][0]
    assert result["pages"] == cached - 1 and result["failed"] == 0
    after = stored_docs(tmp_path / "items.db")
    assert set(after) == set(before)  # the same identities: nothing added
    updated = {key for key, doc in after.items() if doc["rule_version"] == "2"}
    assert result["items"] == len(updated) == 49  # all but the torn page's article
    for key in updated:
        doc, old = after[key], before[key]
        assert doc["headline"] == doc["title"] == old["title"]
        assert doc["first_seen_at"] == old["first_seen_at"]
        assert doc["updated_at"] > old["updated_at"]
        assert (doc["seed_id"], doc["task_id"], doc["url"]) == (
            old["seed_id"], old["task_id"], old["url"])
        assert "duplicate_of" not in doc  # its own fingerprint again: no repost

    # Only pages fetched since a time: none since the future.
    code, result = reparse(monkeypatch, tmp_path, redis_url, namespace, sites_dir,
                           "--since", "2999-01-01T00:00:00Z")
    assert (code, result["pages"], result["items"]) == (1, 0, 0)


def test_a_cache_that_cannot_be_written_costs_no_item(
        tmp_path: Path, redis_url: str, namespace: str, sites_dir: Path,
        site: MeteredSite) -> None:
    (tmp_path / "cache").write_text("a file where the cache's directory should be")
    docs, log = crawl(tmp_path, redis_url, namespace, sites_dir, site,
                      METEORSEED_PAGE_CACHE_URI=f"sqlite:///{tmp_path}/cache/pages.db")
    assert len(docs) == 50
    assert "pages not cached (FileExistsError" in log and "the crawl goes on" in log


def test_keyless_items_keep_their_identity_run_after_run(
        tmp_path: Path, redis_url: str, namespace: str, site: MeteredSite,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Items keyed by their task's URL (``unique_key: url``): the re-parse gives each the
    document the worker gave it, and a second re-parse the same."""
    sites_dir = tmp_path / "sites"
    sites_dir.mkdir()
    rules = (PROJECT / "sites" / "news.yaml").read_text().replace(
        "unique_key: article_id", "unique_key: url")
    (sites_dir / "news.yaml").write_text(rules)
    before, _ = crawl(tmp_path, redis_url, namespace, sites_dir, site)
    assert len(before) == 50 and not any("unique_key" in doc for doc in before.values())
    site.meter(reset=True)
    (sites_dir / "news.yaml").write_text(rules.replace("version: 1", "version: 2"))
    for _ in range(2):
        code, result = reparse(monkeypatch, tmp_path, redis_url, namespace, sites_dir)
        assert (code, result["pages"], result["items"]) == (0, 55, 50)
        after = stored_docs(tmp_path / "items.db")
        assert set(after) == set(before)
        for key, doc in after.items():
            assert doc["rule_version"] == "2" and doc["article_id"] == before[key]["article_id"]
            assert doc["first_seen_at"] == before[key]["first_seen_at"]
            assert "duplicate_of" not in doc
    assert result["links_not_followed"] == 54 and site.meter()["requests"] == 0


def test_two_sites_publishing_the_same_article_are_reposts_across_sites(
        tmp_path: Path, redis_url: str, namespace: str, sites_dir: Path, site: MeteredSite,
        sync_redis: Any) -> None:
    """The same five articles under two site_ids (a wire service and a paper that reprints
    it), with METEORSEED_REPOSTS_ACROSS_SITES: of each pair, one document is the repost of
    the other, whichever site's task ran first."""
    rules = (sites_dir / "news.yaml").read_text()
    (sites_dir / "paper.yaml").write_text(rules.replace("site_id: example_news",
                                                        "site_id: paper"))
    urls = [f"{site.url}/news/article/{n}" for n in range(1, 6)]
    for site_id in ("example_news", "paper"):
        enqueue(redis_url, namespace, urls, site_id=site_id, callback="parse_detail")
    finish(start_sites_worker(tmp_path, redis_url, namespace, sites_dir,
                              settings={"METEORSEED_REPOSTS_ACROSS_SITES": True}), tmp_path)
    docs = stored_docs(tmp_path / "items.db")
    assert len(docs) == 10
    for n in range(1, 6):
        wire, paper = docs[f"example_news:{n}"], docs[f"paper:{n}"]
        assert wire["content_fingerprint"] == paper["content_fingerprint"]
        marks = {wire.get("duplicate_of"), paper.get("duplicate_of")}
        assert marks in ({None, f"example_news:{n}"}, {None, f"paper:{n}"})
        # The first document owns the namespace-wide fingerprint; the other points at it.
        owner = sync_redis.get(f"{namespace}:fp:{wire['content_fingerprint']}")
        assert marks - {None} == {owner}

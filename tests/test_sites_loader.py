"""The rules directory: hot reload, last good version kept, deletions, clashes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from meteorseed_scrapy.sites.loader import SiteRegistry

RULES = """site_id: {site}
version: {version}
list: {{links: "a::attr(href)"}}
fields: {{title: "{title}"}}
"""


def write(path: Path, *, site: str = "news", version: int = 1, title: str = "h1::text",
          raw: str | None = None) -> None:
    path.write_text(raw if raw is not None else RULES.format(site=site, version=version,
                                                             title=title))
    # Same-second rewrites must still look changed, whatever the file system's mtime grain.
    stamp = path.stat().st_mtime_ns + 1_000_000_000 * (version + len(raw or ""))
    os.utime(path, ns=(stamp, stamp))


def title_css(registry: SiteRegistry, site: str = "news") -> str | None:
    config = registry.get(site)
    return None if config is None else config.fields[0].select.css


def test_changed_file_is_picked_up_by_the_next_poll(tmp_path: Path) -> None:
    write(tmp_path / "news.yaml")
    registry = SiteRegistry(tmp_path).load()
    assert registry.get("news").version == "1"  # type: ignore[union-attr]
    assert registry.poll() == []  # nothing changed: nothing re-read
    write(tmp_path / "news.yaml", version=2, title="h1.headline::text")
    registry.apply(registry.poll())
    assert registry.get("news").version == "2"  # type: ignore[union-attr]
    assert title_css(registry) == "h1.headline::text"


def test_bad_edit_keeps_last_good_version_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(tmp_path / "news.yaml")
    registry = SiteRegistry(tmp_path).load()
    write(tmp_path / "news.yaml", raw="site_id: news\nversion: 2\nfields: {title: {css: 3}}\n")
    with caplog.at_level(logging.ERROR, logger="meteorseed_scrapy.sites.loader"):
        registry.apply(registry.poll())
    assert registry.get("news").version == "1"  # type: ignore[union-attr]
    assert registry.errors == 1
    message = caplog.records[-1].getMessage()
    assert "keeping the last good version 1 of site news" in message
    assert f"{tmp_path / 'news.yaml'}: fields.title.css: expected a non-empty string" in message
    write(tmp_path / "news.yaml", version=3)  # fixed: the next poll takes it
    registry.apply(registry.poll())
    assert registry.get("news").version == "3"  # type: ignore[union-attr]


def test_bad_file_at_start_is_skipped_and_others_load(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", site="a")
    write(tmp_path / "b.json", raw="{not json")
    (tmp_path / "notes.txt").write_text("ignored: not a rules file")
    registry = SiteRegistry(tmp_path).load()
    assert set(registry.sites) == {"a"} and registry.errors == 1


def test_deleted_file_removes_its_site(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", site="a")
    write(tmp_path / "b.yaml", site="b")
    registry = SiteRegistry(tmp_path).load()
    (tmp_path / "a.yaml").unlink()
    registry.apply(registry.poll())
    assert set(registry.sites) == {"b"}


def test_a_site_id_defined_twice_keeps_the_first_file(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", site="same", title="h1::text")
    write(tmp_path / "b.yaml", site="same", title="h2::text")
    registry = SiteRegistry(tmp_path).load()
    assert title_css(registry, "same") == "h1::text" and registry.errors == 1


def test_renamed_site_in_a_file_replaces_the_old_one(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", site="old")
    registry = SiteRegistry(tmp_path).load()
    write(tmp_path / "a.yaml", site="new", version=2)
    registry.apply(registry.poll())
    assert set(registry.sites) == {"new"}

"""``METEORSEED_SITES_DIR = "pkg://<package>/<dir>"``: rule files shipped as package data, read
with importlib.resources from an installed package and from a zipped egg (as scrapyd runs a
project); the example project's egg carries its rule files and loads them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from meteorseed_scrapy.sites.loader import SiteRegistry, rules_dir
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.validators import ConfigError as SettingError

REPO = Path(__file__).resolve().parents[1]
RULE = {"site_id": "pkgsite", "version": 1, "allowed_domains": ["a.test"],
        "list": {"links": "a::attr(href)"}, "fields": {"title": "h1::text"}}


def version(registry: SiteRegistry) -> str | None:
    config = registry.get("pkgsite")
    return None if config is None else config.version


@pytest.fixture
def on_path(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0].startswith("rulespkg")]:
        del sys.modules[name]


def test_a_package_directory_loads_and_hot_reloads(on_path: Path) -> None:
    sites = on_path / "rulespkg_dir" / "rules"
    sites.mkdir(parents=True)
    (on_path / "rulespkg_dir" / "__init__.py").write_text("")
    (sites / "a.json").write_text(json.dumps(RULE))
    registry = SiteRegistry("pkg://rulespkg_dir/rules").load()
    assert version(registry) == "1"
    (sites / "a.json").write_text(json.dumps({**RULE, "version": 22}))  # (another size)
    registry.apply(registry.poll())
    assert version(registry) == "22"  # a real directory: stamped by mtime and size


def test_a_zipped_package_loads_like_an_egg(on_path: Path) -> None:
    archive = on_path / "rules.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("rulespkg_zip/__init__.py", "")
        z.writestr("rulespkg_zip/rules/a.json", json.dumps(RULE))
        z.writestr("rulespkg_zip/rules/notes.txt", "not a rule file")
        z.writestr("rulespkg_zip/rules/bad.yaml", "site_id: [")
    sys.path.insert(0, str(archive))
    try:
        directory = rules_dir("pkg://rulespkg_zip/rules")
        assert not isinstance(directory, Path) and directory.is_dir()
        registry = SiteRegistry("pkg://rulespkg_zip/rules").load()
        assert list(registry.sites) == ["pkgsite"] and registry.errors == 1
        assert registry.poll() == []  # unchanged content: nothing to re-apply
        configs = SiteConfigs("pkg://rulespkg_zip/rules", reload_on_read=True)
        assert configs.get("pkgsite") is not None
    finally:
        sys.path.remove(str(archive))


@pytest.mark.parametrize("value", ["pkg://no_such_package_x/sites", "pkg://", "pkg://.x/y"])
def test_a_package_that_cannot_be_imported_names_the_setting(value: str) -> None:
    with pytest.raises(SettingError) as info:
        rules_dir(value)
    assert "METEORSEED_SITES_DIR" in str(info.value)


def test_a_missing_directory_in_a_package_is_no_sites(on_path: Path) -> None:
    (on_path / "rulespkg_none").mkdir()
    (on_path / "rulespkg_none" / "__init__.py").write_text("")
    assert not rules_dir("pkg://rulespkg_none/sites").is_dir()
    assert SiteConfigs("pkg://rulespkg_none/sites", reload_on_read=True).sites == {}


def test_the_example_projects_egg_carries_and_loads_its_rule_files(tmp_path: Path) -> None:
    """What scrapyd runs: the egg scrapyd-deploy builds (setup.py bdist_egg), on sys.path."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "example_project", source, symlinks=True,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "setup.py", "-q", "bdist_egg", "-d", str(tmp_path / "dist")],
                   cwd=source, check=True, capture_output=True, timeout=120)
    [egg] = (tmp_path / "dist").glob("*.egg")
    with zipfile.ZipFile(egg) as z:
        shipped = sorted(n for n in z.namelist() if n.startswith("demo_project/sites/"))
    expected = sorted(f"demo_project/sites/{p.name}" for p in (REPO / "example_project" /
                                                                "sites").iterdir())
    assert shipped == expected
    script = ("import sys; sys.path.insert(0, sys.argv[1]);"
              "from scrapy.utils.project import get_project_settings as g;"
              "from meteorseed_scrapy.sites.loader import SiteRegistry;"
              "d = g()['METEORSEED_SITES_DIR']; r = SiteRegistry(d).load();"
              "print(d, sorted(r.sites), r.errors)")
    out = subprocess.run([sys.executable, "-c", script, str(egg)], cwd=tmp_path,
                         env={"SCRAPY_SETTINGS_MODULE": "demo_project.settings",
                              "PATH": "/usr/bin:/bin"},
                         check=True, capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("pkg://demo_project/sites [") and out.rstrip().endswith(" 0")
    assert "'example_news'" in out

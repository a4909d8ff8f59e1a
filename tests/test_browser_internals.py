"""The private parts of scrapy-playwright that the browser handler (sites/browser.py) uses: in
the installed release, which is within the range they were checked on, and used nowhere else;
a release lacking one is refused naming it before any browser is launched."""

from __future__ import annotations

import configparser
import re
import types
from pathlib import Path

import pytest
from packaging.version import Version

from meteorseed_scrapy.sites import browser
from meteorseed_scrapy.sites.render import RenderUnavailable
from tests.internals_helpers import SETUP_CFG, assert_in_checked_range, offenders

pw = pytest.importorskip("scrapy_playwright.handler")
PACKAGE = Path(browser.__file__).parent.parent


def test_every_private_part_used_is_in_the_installed_scrapy_playwright() -> None:
    assert browser.missing(pw) == []
    browser.check(pw)


def test_the_installed_release_is_in_the_checked_range() -> None:
    assert_in_checked_range("scrapy-playwright", browser.PLAYWRIGHT_CHECKED_ON,
                            "sites/browser.py")


def test_the_checked_floor_is_setup_cfgs() -> None:
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    floor = re.search(r"scrapy-playwright>=\s*([\d.]+)",
                      config["options.extras_require"]["playwright"])
    assert floor is not None
    assert Version(floor.group(1)) == Version(browser.PLAYWRIGHT_CHECKED_ON[0])


@pytest.mark.parametrize("lacking", [browser.PRIVATE_FLAG, *browser.PRIVATE_METHODS])
def test_a_release_lacking_a_part_is_refused_naming_it(lacking: str) -> None:
    handler = type("ScrapyPlaywrightDownloadHandler", (), {
        name: (lambda self: None) for name in browser.PRIVATE_METHODS if name != lacking})
    module = types.SimpleNamespace(ScrapyPlaywrightDownloadHandler=handler)
    if lacking != browser.PRIVATE_FLAG:
        setattr(module, browser.PRIVATE_FLAG, True)
    with pytest.raises(RenderUnavailable, match=re.escape(lacking)) as refused:
        browser.check(module)
    assert browser.PLAYWRIGHT_CHECKED_ON[1] in str(refused.value)


def test_no_other_module_touches_scrapy_playwrights_privates() -> None:
    names = "|".join(re.escape(n) for n in (browser.PRIVATE_FLAG, *browser.PRIVATE_METHODS))
    assert offenders(PACKAGE, re.compile(rf"\b({names})\b"), "browser.py",
                     mentioning="playwright") == []

"""Our components in Scrapy's component dicts: added once, never over the project's own entry
(by path or by class), checked with Scrapy's own build_component_list."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.settings import Settings
from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from meteorseed_scrapy.components import add_component, listed, switch_off
from meteorseed_scrapy.sites import render
from meteorseed_scrapy.sites.page_cache import EXTENSION as PAGE_CACHE
from meteorseed_scrapy.sites.pipeline import PIPELINE
from meteorseed_scrapy.sites.spider import RuleSpider

OURS = {"ITEM_PIPELINES": (PIPELINE, 800), "EXTENSIONS": (PAGE_CACHE, 0),
        "DOWNLOADER_MIDDLEWARES": (render.MIDDLEWARE, render.MIDDLEWARE_ORDER)}


def orders(settings: Settings, name: str) -> dict[Any, Any]:
    """What Scrapy builds from ``name``: component -> order (raises as Scrapy would on two
    keys of one component)."""
    built = build_component_list(settings.getwithbase(name))
    merged = settings.getwithbase(name)
    by_class = {load_object(key): merged[key] for key in merged}
    return {load_object(c): by_class[load_object(c)] for c in built}


@pytest.mark.parametrize("name", sorted(OURS))
@pytest.mark.parametrize("by_class", [True, False], ids=["by class", "by path"])
def test_the_sites_spider_keeps_the_projects_own_entry(name: str, by_class: bool) -> None:
    path, _ = OURS[name]
    key = load_object(path) if by_class else path
    settings = Settings()
    settings.set(name, {key: 333, "tests.test_components.Other": 5}, priority="project")
    RuleSpider.update_settings(settings)
    built = orders(settings, name)
    assert built[load_object(path)] == 333
    assert sum(1 for c in build_component_list(settings.getwithbase(name))
               if load_object(c) is load_object(path)) == 1


@pytest.mark.parametrize("name", sorted(OURS))
@pytest.mark.parametrize(("given", "kept"), [
    ("project", 30),  # raised to "spider": scrapy crawl's merge keeps them
    ("cmdline", 40),  # -s: never lowered (a set at "spider" would be ignored under it)
])
def test_the_sites_spider_adds_its_components_once_at_their_order(name: str, given: str,
                                                                  kept: int) -> None:
    path, order = OURS[name]
    settings = Settings()
    settings.set(name, {"tests.test_components.Other": 5}, priority=given)
    RuleSpider.update_settings(settings)
    RuleSpider.update_settings(settings)  # (twice: still one entry)
    assert orders(settings, name)[load_object(path)] == order
    assert settings.getpriority(name) == kept
    assert listed(settings, name, path)


def test_a_component_dict_given_on_the_command_line_still_gets_ours() -> None:
    settings = Settings()
    settings.set("ITEM_PIPELINES", {"tests.test_components.Other": 5}, priority="cmdline")
    add_component(settings, "ITEM_PIPELINES", PIPELINE, 800, priority="spider")
    assert orders(settings, "ITEM_PIPELINES")[load_object(PIPELINE)] == 800
    assert settings.getpriority("ITEM_PIPELINES") == 40  # (cmdline's, not lowered)


def test_switch_off_leaves_a_component_the_project_lists() -> None:
    retry = "scrapy.downloadermiddlewares.retry.RetryMiddleware"
    own = Settings({"DOWNLOADER_MIDDLEWARES": {load_object(retry): 551}})
    switch_off(own, "DOWNLOADER_MIDDLEWARES", retry)
    assert orders(own, "DOWNLOADER_MIDDLEWARES")[load_object(retry)] == 551
    bare = Settings()
    switch_off(bare, "DOWNLOADER_MIDDLEWARES", retry)
    assert load_object(retry) not in orders(bare, "DOWNLOADER_MIDDLEWARES")


class Other:
    pass

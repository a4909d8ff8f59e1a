"""Every downloader middleware the add-on registers is registered by its one documented path,
``meteorseed_scrapy.middlewares.<Name>``, whatever module defines it."""

from __future__ import annotations

from scrapy.settings import Settings
from scrapy.utils.misc import load_object

from meteorseed_scrapy import addon, middlewares
from meteorseed_scrapy.addon import MeteorSeedAddon

PATH = "meteorseed_scrapy.middlewares."


def test_every_middleware_the_addon_registers_is_under_the_one_path() -> None:
    settings = Settings()
    MeteorSeedAddon().update_settings(settings)
    ours = [load_object(key) for key in settings.getdict("DOWNLOADER_MIDDLEWARES")]
    ours = [cls for cls in ours if cls.__module__.startswith("meteorseed_scrapy.")]
    assert len(ours) >= 10
    for cls in ours:
        assert cls.__name__ in middlewares.__all__
        assert load_object(PATH + cls.__name__) is cls


def test_the_addons_paths_are_the_documented_ones() -> None:
    paths = [addon.SLOT_MIDDLEWARE, addon.BACKOFF_MIDDLEWARE, addon.BREAKER_MIDDLEWARE,
             addon.ADAPTIVE_MIDDLEWARE, addon.LOG_SETUP, addon.OUR_ROBOTS,
             *addon.HYGIENE_MIDDLEWARES]
    assert [path for path in paths if not path.startswith(PATH)] == []

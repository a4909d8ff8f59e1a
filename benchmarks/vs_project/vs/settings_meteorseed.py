"""MeteorSeed: the one add-on line (scheduler, store pipeline, middlewares)."""

from vs.settings import *  # noqa: F403

ADDONS = {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}

"""The add-on turns on Scrapy's periodic stats log, so a worker that never closes (scrapyd jobs
with METEORSEED_IDLE_CLOSE = 0) still shows its counters; a project's own settings win."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.extensions.periodic_log import PeriodicLog
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.addon import PERIODIC_LOG

ADDONS = {"ADDONS": {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}}


def _crawler(**settings: Any) -> Any:
    return get_crawler(settings_dict={**ADDONS, **settings})


def _extensions(crawler: Any) -> dict[Any, Any]:
    """EXTENSIONS by class (the add-on lists its components as classes, a project as paths)."""
    listed = crawler.settings.getdict("EXTENSIONS")
    return {load_object(key): value for key, value in listed.items()}


def test_the_addon_enables_the_periodic_stats_log(caplog: pytest.LogCaptureFixture) -> None:
    crawler = _crawler()
    assert _extensions(crawler)[PeriodicLog] == 0
    ext = PeriodicLog.from_crawler(crawler)
    assert crawler.stats is not None
    crawler.stats.set_value("meteorseed/acked", 3)
    crawler.stats.set_value("item_scraped_count", 2)
    crawler.stats.set_value("scheduler/enqueued", 9)  # not one of ours: left out
    ext.delta_prev = {}  # what spider_opened sets, without starting its looping call
    with caplog.at_level(logging.INFO, logger="scrapy.extensions.periodic_log"):
        ext.log()
    logged = json.loads(caplog.records[-1].getMessage())
    assert logged["stats"] == {"item_scraped_count": 2, "meteorseed/acked": 3}
    assert logged["delta"] == {"item_scraped_count": 2, "meteorseed/acked": 3}


@pytest.mark.parametrize("override", [
    {"PERIODIC_LOG_STATS": False, "PERIODIC_LOG_DELTA": False},
    {"LOGSTATS_INTERVAL": 0},
])
def test_a_project_switches_it_off(override: dict[str, Any]) -> None:
    with pytest.raises(NotConfigured):
        PeriodicLog.from_crawler(_crawler(**override))


def test_a_project_chooses_its_own_stats() -> None:
    crawler = _crawler(PERIODIC_LOG_STATS={"include": ["downloader/"]})
    ext = PeriodicLog.from_crawler(crawler)
    assert ext.ext_stats_include == ["downloader/"]
    assert ext.ext_delta_include  # the add-on's delta stays on


def test_a_project_can_drop_the_extension() -> None:
    crawler = _crawler(EXTENSIONS={PERIODIC_LOG: None})
    assert _extensions(crawler)[PeriodicLog] is None

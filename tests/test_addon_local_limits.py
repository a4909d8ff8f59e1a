"""The add-on says once when Scrapy's per-process limits (the project template's
DOWNLOAD_DELAY = 1, CONCURRENT_REQUESTS_PER_DOMAIN = 1) hold a worker below its sites' limits."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from scrapy.settings import Settings

from meteorseed_scrapy import addon
from meteorseed_scrapy.addon import MeteorSeedAddon
from meteorseed_scrapy.politeness.local_limits import local_limits, local_limits_warning

TEMPLATE = {"DOWNLOAD_DELAY": 1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}


def _settings(project: dict[str, Any], cmdline: dict[str, Any] | None = None) -> Settings:
    settings = Settings()
    settings.setdict(project, priority="project")
    settings.setdict(cmdline or {}, priority="cmdline")
    return settings


def test_the_template_values_are_named_with_their_effect_and_the_remedy() -> None:
    line = local_limits_warning(_settings(TEMPLATE))
    assert line is not None
    assert "DOWNLOAD_DELAY = 1 holds each worker to 1 request(s)/s per site, below " \
        "METEORSEED_SITE_RATE = 2" in line
    assert "CONCURRENT_REQUESTS_PER_DOMAIN = 1 holds each worker to 1 request(s) in flight " \
        "per site, below METEORSEED_SITE_CONCURRENCY = 4" in line
    assert "remove them from settings.py" in line


@pytest.mark.parametrize(("project", "cmdline"), [
    ({}, {}),  # Scrapy's defaults: no delay, 8 per domain
    ({"DOWNLOAD_DELAY": 0.25, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}, {}),  # 4/s >= 2/s
    (TEMPLATE, {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 16}),  # -s wins
    ({**TEMPLATE, "METEORSEED_SITE_RATE": 1, "METEORSEED_SITE_CONCURRENCY": 1}, {}),
    ({**TEMPLATE, "METEORSEED_POLITENESS": False}, {}),  # Scrapy's limits are the only ones
    ({"CONCURRENT_REQUESTS_PER_IP": 0}, {}),  # 0: off
])
def test_limits_that_hold_nothing_back_are_not_mentioned(
        project: dict[str, Any], cmdline: dict[str, Any]) -> None:
    assert local_limits(_settings(project, cmdline)) == []


def test_per_ip_and_a_sites_higher_rate_count_too() -> None:
    found = local_limits(_settings({"CONCURRENT_REQUESTS_PER_IP": 2, "DOWNLOAD_DELAY": 0.25,
                                    "METEORSEED_SITE_RATE": 10}))
    assert [line.split(" = ")[0] for line in found] == [
        "DOWNLOAD_DELAY", "CONCURRENT_REQUESTS_PER_IP"]


def test_the_addon_says_it_once(caplog: pytest.LogCaptureFixture,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(addon, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="meteorseed_scrapy.addon"):
        for _ in range(2):
            MeteorSeedAddon().update_settings(_settings(TEMPLATE))
        MeteorSeedAddon().update_settings(_settings({}))
    lines = [r.getMessage() for r in caplog.records if "DOWNLOAD_DELAY" in r.getMessage()]
    assert len(lines) == 1 and caplog.records[0].levelno == logging.WARNING

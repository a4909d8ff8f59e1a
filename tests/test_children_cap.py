"""Children per task are capped for every spider (METEORSEED_MAX_CHILDREN_PER_TASK): a callback
yielding far more requests than the cap has its first ones written, the rest dropped with one
warning naming the task's URL and the cap, a stat, and an anomaly on its completion record;
the task is acked (issue 22: a page with 1 M links held its parent 425 s and 1.4 GB)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.setting_checks import check_settings
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.sites import DemoSite
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.yielded import CAP_SETTING, OVER_CAP_STAT
from tests.e2e_helpers import add_tasks, start_worker


@pytest.mark.parametrize("value", [0, -3, "many", 1.5])
def test_a_bad_cap_is_refused_naming_the_setting(value: Any) -> None:
    with pytest.raises(ConfigError, match=CAP_SETTING):
        check_settings(get_crawler(settings_dict={CAP_SETTING: value}).settings)


def test_a_task_yielding_more_requests_than_the_cap_is_acked_with_the_first_ones(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any) -> None:
    with DemoSite(sections=("test",)) as site:
        url = f"{site.url}/status/200?fanout=60"
        [parent] = add_tasks(redis_url, namespace, [
            ExecTask.create(seed_id="s", site_id="probe", url=url)])
        worker = start_worker(tmp_path, redis_url, namespace, **{CAP_SETTING: 7})
        assert worker.wait() == 0, worker.log()[-3000:]
        children = [site.hits(f"/status/200?child={i}") for i in range(60)]
    assert children == [1] * 7 + [0] * 53
    log = worker.log()
    warnings = [line for line in log.splitlines() if CAP_SETTING in line]
    assert len(warnings) == 1, warnings
    assert "WARNING" in warnings[0] and url in warnings[0] and "(7)" in warnings[0]
    assert worker.stats()[OVER_CAP_STAT] == 53
    keys = KeyLayout(namespace)
    record = json.loads(sync_redis.get(keys.for_site("probe").done(parent.task_id)))
    assert record["outcome"] == "done"
    assert record["anomalies"] == ["children over cap: 53 yielded requests dropped"
                                   f" ({CAP_SETTING})"]
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 0

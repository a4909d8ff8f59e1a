"""Children per task are capped for every spider (METEORSEED_MAX_CHILDREN_PER_TASK): a callback
yielding far more requests than the cap has its first ones written, the rest dropped with one
warning naming the task's URL and the cap, a stat, and an anomaly on its completion record;
the task is acked (issue 22: a page with 1 M links held its parent 425 s and 1.4 GB). The drop
happens nearest the spider, before Scrapy's own spider middlewares handle those requests."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.addon import MeteorSeedAddon
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.setting_checks import check_settings
from meteorseed_scrapy.task.context import CURRENT_SCRAPE, TASK_META_KEY, Scrape
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.sites import DemoSite
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.children_cap import CAP_SETTING, OVER_CAP_STAT, ChildrenCapMiddleware
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
        settings: dict[str, Any] = {CAP_SETTING: 7, "DEPTH_STATS_VERBOSE": True}
        worker = start_worker(tmp_path, redis_url, namespace, **settings)
        assert worker.wait() == 0, worker.log()[-3000:]
        children = [site.hits(f"/status/200?child={i}") for i in range(60)]
    assert children == [1] * 7 + [0] * 53
    log = worker.log()
    warnings = [line for line in log.splitlines() if CAP_SETTING in line]
    assert len(warnings) == 1, warnings
    assert "WARNING" in warnings[0] and url in warnings[0] and "(7)" in warnings[0]
    stats = worker.stats()
    assert stats[OVER_CAP_STAT] == 53
    # (dropped before Scrapy's DepthMiddleware saw them: it counted the 7 kept alone)
    assert stats["request_depth_count/1"] == 7
    assert stats["item_scraped_count"] == 8  # the parent's item and its 7 children's
    keys = KeyLayout(namespace)
    record = json.loads(sync_redis.get(keys.for_site("probe").done(parent.task_id)))
    assert record["outcome"] == "done"
    assert record["anomalies"] == ["children over cap: 53 yielded requests dropped"
                                   f" ({CAP_SETTING})"]
    assert sync_redis.xpending(keys.stream, keys.group)["pending"] == 0


def _output(cap: int, outputs: list[Any], *, of_task: bool = True, asynchronous: bool = True
            ) -> tuple[list[Any], Scrape]:
    """What the middleware passes of ``outputs`` from a task's response (its scrape current)."""
    crawler = get_crawler(Spider, {CAP_SETTING: cap})
    crawler.stats.open_spider()
    middleware = ChildrenCapMiddleware.from_crawler(crawler)
    task = ExecTask.create(seed_id="s", site_id="probe", url="http://127.0.0.1/page")
    request = Request(task.url, meta={TASK_META_KEY: task} if of_task else {})
    response = HtmlResponse(task.url, body=b"<html></html>", request=request)
    scrape = Scrape(task)

    async def run() -> list[Any]:
        async def source() -> Any:
            for one in outputs:
                yield one
        return [o async for o in middleware.process_spider_output_async(response, source())]

    token = CURRENT_SCRAPE.set(scrape)
    try:
        passed = asyncio.run(run()) if asynchronous else list(
            middleware.process_spider_output(response, iter(outputs)))
    finally:
        CURRENT_SCRAPE.reset(token)
    return passed, scrape


@pytest.mark.parametrize("asynchronous", [True, False])
def test_every_item_passes_and_only_the_requests_over_the_cap_are_dropped(
        asynchronous: bool) -> None:
    requests = [Request(f"http://127.0.0.1/{i}") for i in range(5)]
    items = [{"unique_key": str(i)} for i in range(5)]
    outputs = [x for pair in zip(items, requests, strict=True) for x in pair]
    passed, scrape = _output(2, outputs, asynchronous=asynchronous)
    assert passed == [items[0], requests[0], items[1], requests[1], *items[2:]]
    assert (scrape.children_yielded, scrape.children_dropped) == (2, 3)


def test_requests_of_no_task_are_not_counted() -> None:
    requests = [Request(f"http://127.0.0.1/{i}") for i in range(5)]
    passed, scrape = _output(2, requests, of_task=False)
    assert passed == requests and scrape.children_dropped == 0


def test_the_addon_places_it_nearest_the_spider_unless_the_project_placed_it() -> None:
    settings = Settings()
    MeteorSeedAddon().update_settings(settings)
    orders = {load_object(k): v for k, v in settings.getwithbase("SPIDER_MIDDLEWARES").items()}
    assert orders[ChildrenCapMiddleware] == max(orders.values())
    project = Settings()
    project.set("SPIDER_MIDDLEWARES", {
        "meteorseed_scrapy.worker.children_cap.ChildrenCapMiddleware": None}, "project")
    MeteorSeedAddon().update_settings(project)
    assert {load_object(k): v for k, v in project.getdict("SPIDER_MIDDLEWARES").items()
            }[ChildrenCapMiddleware] is None

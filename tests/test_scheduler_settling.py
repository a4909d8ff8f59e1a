"""The scheduler holds back new work while enough responses wait for their scrape to finish."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.queue.delivery import Delivery
from meteorseed_scrapy.scheduler import StreamScheduler
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.worker.ledger import Outcome


def book(scheduler: StreamScheduler, n: int) -> Any:
    task = ExecTask.create(seed_id="s", site_id="site", url=f"https://site.test/{n}")
    entry = scheduler.ledger.add(Delivery("ns:tasks", f"1-{n}", {}, 1, task))
    assert entry is not None
    entry.started = True
    return entry


def test_next_request_waits_while_max_settling_scrapes_are_running() -> None:
    crawler = get_crawler(settings_dict={"CONCURRENT_REQUESTS": 8, "METEORSEED_MAX_SETTLING": 3})
    scheduler = StreamScheduler.from_crawler(crawler)
    woken: list[bool] = []
    scheduler._wake = lambda: woken.append(True)  # type: ignore[method-assign]
    handed: list[str] = []
    scheduler.pump = SimpleNamespace(  # type: ignore[assignment]
        stopping=False, desk=None, hops=SimpleNamespace(sites=lambda: [], pop=lambda s: None),
        buffer=SimpleNamespace(sites=lambda: handed.append("asked") or []),
        settle=lambda entry: None,
    )
    entries = [book(scheduler, n) for n in range(4)]
    for entry in entries[:3]:
        entry.response_at = 1.0  # responses in the scraper
    assert scheduler.next_request() is None
    assert handed == []  # refused before looking at the buffer
    response = HtmlResponse("https://site.test/0", status=200, body=b"<html></html>")
    scheduler._scrape_finished(None, entries[0], response, Request(response.url))
    assert entries[0].outcome is Outcome.DONE and woken == [True]
    assert scheduler.next_request() is None
    assert handed == ["asked"]  # two scrapes running now: work may be handed out again


def test_max_settling_defaults_to_the_download_capacity() -> None:
    crawler = get_crawler(settings_dict={"CONCURRENT_REQUESTS": 24})
    assert StreamScheduler.from_crawler(crawler).max_settling == 24

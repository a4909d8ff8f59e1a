"""Start requests go through the stream, yet ``start()`` is paced as on stock Scrapy: the
lazy-start pattern of Scrapy's docs holds the iteration while requests are in flight, so the
requests callbacks yield go before later start requests; and the scheduler does not look empty
while a request it took is on its way through Redis."""

from __future__ import annotations

from pathlib import Path

from scrapy import Request

from meteorseed_scrapy.testing.polling import wait_until
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import start_worker
from tests.test_pump import Rig, make_task, ok, run


def test_the_lazy_start_pattern_lets_a_callback_request_go_before_later_start_requests(
    tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite
) -> None:
    worker = start_worker(tmp_path, redis_url, namespace, CONCURRENT_REQUESTS=1,
                          spider="order_probe", spider_args={"base_url": demo_site.url})
    assert worker.wait() == 0, worker.log()[-3000:]
    assert worker.stats()["probe/order"] == ["1", "2", "3", "4"]


def test_a_request_written_and_not_yet_read_back_is_pending(
    redis_url: str, namespace: str
) -> None:
    async def body(rig: Rig) -> list[bool]:
        await rig.enqueue(make_task(1), make_task(2))
        taken = [await rig.take(), await rig.take()]  # capacity and prefetch: no more reads
        assert not rig.pump.has_work()
        assert rig.pump.child(None, Request("https://shop.test/p/3"))
        await wait_until(lambda: rig.stats.get_value("meteorseed/children/enqueued") == 1
                         and not rig.pump._completions.outbox)
        pending = [rig.pump.has_work()]  # written, not read: Scrapy would have it scheduled
        for request in taken:
            rig.pump.scrape_started(request)
            rig.pump.finished(request, ok(request))
        third = await rig.take()
        assert third.url == "https://shop.test/p/3"
        await wait_until(lambda: not rig.pump.has_work())
        return pending

    assert run(redis_url, namespace, body, CONCURRENT_REQUESTS=1) == [True]

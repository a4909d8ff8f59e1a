"""Per-site limits from rule configs, shared quotas (``limits.quota_key``), degrade by priority."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.middlewares import BackoffMiddleware
from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.politeness.permits import SiteQueues
from meteorseed_scrapy.politeness.policy import SiteLimits
from meteorseed_scrapy.scheduler import StreamScheduler
from meteorseed_scrapy.sites.model import Limits
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.loopback import LoopbackHandler, LoopbackSite
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.dispatcher import Dispatcher
from tests.e2e_helpers import enqueue, start_worker, stored_docs
from tests.queue_helpers import paused_for
from tests.test_politeness_gate import make_gate, run

SITE = """site_id: {site_id}
version: "{version}"
start: detail
fields:
  title: {{css: "title::text"}}
limits:
{limits}
"""

DEFAULTS = SiteLimits(rate=2.0, burst=5, concurrency=4)
NO_REDIS = SimpleNamespace(register_script=lambda source: None)  # breakers judged locally only


def write_site(directory: Path, site_id: str, limits: str, version: int = 1) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"{site_id}.yaml"
    path.write_text(SITE.format(site_id=site_id, version=version, limits=limits))
    return path


def test_rule_config_limits_override_the_defaults_field_by_field() -> None:
    limits = DEFAULTS.overridden(Limits(rate=0.5, concurrency=1, timeout=7.0, quota_key="h"))
    assert limits == SiteLimits(rate=0.5, burst=5, concurrency=1, quota_key="h", timeout=7.0)
    assert limits.quota("news") == "h"
    assert DEFAULTS.overridden(Limits()) == DEFAULTS
    assert DEFAULTS.quota("news") == "news"


def test_scheduler_limits_follow_the_site_rule_file(tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    path = write_site(sites, "slow", "  rate: 0.5\n  burst: 2\n  concurrency: 1")
    crawler = get_crawler(settings_dict={
        "METEORSEED_SITES_DIR": str(sites), "METEORSEED_SITES_RELOAD_INTERVAL": 0.0001,
        "METEORSEED_SITE_RATE": 9, "METEORSEED_SITE_CONCURRENCY": 8,
    })
    scheduler = StreamScheduler.from_crawler(crawler)
    slow = scheduler.limits_for("slow")
    assert (slow.rate, slow.burst, slow.concurrency) == (0.5, 2, 1)
    assert scheduler.limits_for("slow") is slow  # cached while the config is unchanged
    other = scheduler.limits_for("unknown")  # no rule config: the settings' defaults
    assert (other.rate, other.burst, other.concurrency) == (9.0, 5, 8)

    write_site(sites, "slow", "  rate: 3\n  quota_key: shared-host", version=2)
    os.utime(path, (time.time() + 5, time.time() + 5))
    # Looked at again once the reload interval has passed (on the next call after it).
    hot = wait_for(lambda: (limits := scheduler.limits_for("slow")) is not slow and limits,
                   10, 0.01)
    assert (hot.rate, hot.burst, hot.concurrency, hot.quota_key) == (3.0, 5, 8, "shared-host")


def test_sites_sharing_a_quota_key_share_tokens_leases_and_pauses(
    redis_url: str, namespace: str
) -> None:
    shared = SiteLimits(rate=0.001, burst=4, concurrency=3, quota_key="one-host")
    own = SiteLimits(rate=0.001, burst=4, concurrency=3)
    by_site = {"a": shared, "b": shared, "c": own}

    async def scenario(client: Any) -> dict[str, Any]:
        gate = make_gate(client, namespace, DEFAULTS)
        gate.limits_for = by_site.__getitem__
        a = await gate.acquire("a", 2)
        b = await gate.acquire("b", 5)  # the shared concurrency cap (3) has one lease left
        c = await gate.acquire("c", 3)  # a site of its own is not affected
        await gate.release([("a", lease) for lease in a.lease_ids])
        b_again = await gate.acquire("b", 5)  # a's leases came back, but the bucket is empty
        await gate.pause("b", 30)
        return {"a": len(a.lease_ids), "b": len(b.lease_ids), "c": len(c.lease_ids),
                "b_again": len(b_again.lease_ids), "a_paused": await paused_for(gate, "a"),
                "c_paused": await paused_for(gate, "c")}

    seen = run(redis_url, scenario)
    assert (seen["a"], seen["b"], seen["c"]) == (2, 1, 3)
    assert seen["b_again"] == 1  # burst 4 spent: a 2, b 1, this 1
    assert seen["a_paused"] > 20  # a 429 on b pauses every site of its host
    assert seen["c_paused"] == 0


def test_site_retries_come_from_its_rule_config(tmp_path: Path) -> None:
    sites = tmp_path / "sites"
    write_site(sites, "flaky", "  retries: 7")
    crawler = get_crawler(settings_dict={"METEORSEED_SITES_DIR": str(sites), "RETRY_TIMES": 2})
    middleware = BackoffMiddleware.from_crawler(crawler)
    assert middleware.retries_for("flaky") == 7
    assert middleware.retries_for("other") == 2


def test_degrade_settings_are_validated() -> None:
    config = BreakerConfig.from_settings(get_crawler(settings_dict={
        "METEORSEED_BREAKER_DEGRADE_AFTER": 120, "METEORSEED_BREAKER_DEGRADE_BELOW": 5,
    }).settings)
    assert (config.degrade_after, config.degrade_below, config.degrade_delay) == (120, 5, 600)
    with pytest.raises(ConfigError, match="METEORSEED_BREAKER_DEGRADE_BELOW"):
        BreakerConfig.from_settings(get_crawler(settings_dict={
            "METEORSEED_BREAKER_DEGRADE_BELOW": "high"}).settings)


class FakeStats:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def inc_value(self, key: str, count: int = 1) -> None:
        self.values[key] = self.values.get(key, 0) + count


def entry(priority: int, n: int) -> Any:
    task = ExecTask.create(seed_id="s", site_id="down", url=f"https://down.test/{n}",
                           priority=priority)
    return SimpleNamespace(task=task)


def dispatcher_for(breaker: Breaker, parked: list[tuple[Any, float]],
                   whys: list[DeferReason] | None = None) -> tuple[Dispatcher, SiteQueues]:
    buffer = SiteQueues()

    def park(e: Any, delay: float, why: DeferReason) -> None:
        parked.append((e, delay))
        if whys is not None:
            whys.append(why)

    dispatcher = Dispatcher(
        desk=None, buffer=buffer, hops=SiteQueues(),  # type: ignore[arg-type]
        limits_for=lambda _s: SiteLimits(rate=10.0, burst=5, concurrency=4), breaker=breaker,
        budget=lambda: 10, on_change=lambda: None, park=park, stats=breaker.stats,
    )
    return dispatcher, buffer


def test_a_site_open_for_long_parks_its_low_priority_tasks_for_longer() -> None:
    config = BreakerConfig(probe_interval=60, degrade_after=300, degrade_delay=900, degrade_below=1)
    breaker = Breaker(NO_REDIS, None, config, FakeStats())  # type: ignore[arg-type]
    parked: list[tuple[Any, float]] = []
    whys: list[DeferReason] = []
    dispatcher, buffer = dispatcher_for(breaker, parked, whys)
    for n, priority in enumerate([0, 5, -1, 1]):
        buffer.append("down", entry(priority, n))

    breaker.state["down"] = "open"
    breaker._opened_at["down"] = time.monotonic() - 10  # open, but not for long yet
    dispatcher._park_excess("down", 60.0)
    assert sorted(round(d) for _, d in parked) == [60, 60, 60, 60]  # all back at the probe
    assert whys == [DeferReason.SICK] * 4  # recorded in the delayed set: status shows why

    parked.clear()
    whys.clear()
    for n, priority in enumerate([0, 5, -1, 1]):
        buffer.append("down", entry(priority, n))
    breaker._opened_at["down"] = time.monotonic() - 301
    dispatcher._park_excess("down", 60.0)
    delays = {e.task.priority: d for e, d in parked}
    assert delays[5] < 61 and delays[1] < 61  # important tasks still come back at each probe
    assert delays[0] >= 900 and delays[-1] >= 900  # the rest are parked for long
    reasons = {e.task.priority: why for (e, _), why in zip(parked, whys, strict=True)}
    assert reasons == {5: DeferReason.SICK, 1: DeferReason.SICK, 0: DeferReason.PRIORITY,
                       -1: DeferReason.PRIORITY}
    assert breaker.stats.values["meteorseed/breaker/down/degraded"] == 2


def test_a_recovering_site_keeps_its_most_important_tasks_in_memory() -> None:
    breaker = Breaker(NO_REDIS, None, BreakerConfig(), FakeStats())  # type: ignore[arg-type]
    parked: list[tuple[Any, float]] = []
    dispatcher, buffer = dispatcher_for(breaker, parked)
    for n in range(60):
        buffer.append("down", entry(9 if n >= 50 else 0, n))
    breaker.state["down"] = "ramp"
    dispatcher._park_excess("down", 1.0)  # keeps max(4, rate 10 * 2 s) = 20 of them
    kept = [buffer.pop("down") for _ in range(len(buffer))]
    assert len(kept) == 20
    assert [e.task.priority for e in kept[:10]] == [9] * 10  # the priority-9 tasks first
    assert all(e.task.priority == 0 for e, _ in parked)


def test_a_healthy_site_parks_for_a_pause_or_its_quota() -> None:
    breaker = Breaker(NO_REDIS, None, BreakerConfig(), FakeStats())  # type: ignore[arg-type]
    parked: list[tuple[Any, float]] = []
    whys: list[DeferReason] = []
    dispatcher, buffer = dispatcher_for(breaker, parked, whys)
    for n in range(30):
        buffer.append("down", entry(0, n))
    dispatcher._park_excess("down", 1.0)  # can go soon: more than 2 s of its rate parked
    assert len(parked) == 10 and set(whys) == {DeferReason.QUOTA}
    whys.clear()
    dispatcher._park_excess("down", 30.0)  # must wait long: a pause (or far behind quota)
    assert len(whys) == 20 and set(whys) == {DeferReason.PAUSED}


def test_breaker_degrade_needs_the_breaker_open() -> None:
    breaker = Breaker(NO_REDIS, None, BreakerConfig(degrade_after=1), FakeStats())  # type: ignore
    assert breaker.degraded("x", 0) == 0.0
    breaker.state["x"] = "open"
    breaker._opened_at["x"] = time.monotonic() - 5
    assert breaker.degraded("x", 0) == 600.0
    assert breaker.degraded("x", 1) == 0.0
    asyncio.run(asyncio.sleep(0))  # nothing left pending


# -- end to end: what the server sees -----------------------------------------------------------


class ArrivalSite(LoopbackSite):
    """Small pages; records when each path arrived (monotonic seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, str]] = []


class _Arrivals(LoopbackHandler):
    site: ArrivalSite

    def serve(self, head: bool = False) -> None:
        with self.site.lock:
            self.site.arrivals.append((time.monotonic(), self.path))
        self.send_page(200, "text/html", f"<html><title>{self.path}</title></html>".encode(),
                       {}, head)


ArrivalSite.handler = _Arrivals


@pytest.mark.e2e
def test_worker_honours_rule_config_rates_and_a_shared_quota(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    sites = tmp_path / "sites"
    # The probe project's defaults are 1000 req/s: only the rule files can slow these down.
    write_site(sites, "alone", "  rate: 4\n  burst: 1")
    write_site(sites, "host_a", "  rate: 4\n  burst: 1\n  quota_key: one-host")
    write_site(sites, "host_b", "  rate: 4\n  burst: 1\n  quota_key: one-host")
    with ArrivalSite() as site:
        for site_id in ("alone", "host_a", "host_b"):
            enqueue(redis_url, namespace, [f"{site.url}/{site_id}/{i}" for i in range(9)],
                    site_id=site_id)
        worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_SITES_DIR=str(sites))
        assert worker.wait() == 0, worker.log()[-3000:]
        arrivals = list(site.arrivals)

    def span(prefixes: tuple[str, ...]) -> tuple[int, float]:
        times = [t for t, path in arrivals if path.startswith(prefixes)]
        return len(times), max(times) - min(times)

    # 1 token at once, then 4 a second (Redis TIME): 9 requests take at least 8 / 4 = 2 s.
    n, seconds = span(("/alone/",))
    assert n == 9 and seconds >= 1.9
    # The two sites of one host share it: 18 requests at 4 a second take at least 17 / 4 s.
    n, seconds = span(("/host_a/", "/host_b/"))
    assert n == 18 and seconds >= 4.1
    assert len(stored_docs(tmp_path / "items.db")) == 27

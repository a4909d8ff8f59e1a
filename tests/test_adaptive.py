"""The fleet-wide adaptive limit against a real Redis: lua/adaptive.lua's rule (Scrapy's
AutoThrottle made fleet-wide), the gate granting at its delay, robots.txt caps, the add-on's
hand-over from Scrapy's AutoThrottle and the rule format's ``adaptive``/``ignore_crawl_delay``."""

from __future__ import annotations

import asyncio
import logging
import math
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from protego import Protego
from scrapy.settings import Settings

from meteorseed_scrapy.addon import MeteorSeedAddon
from meteorseed_scrapy.politeness.adaptive import AdaptiveTarget, LatencySamples
from meteorseed_scrapy.politeness.gate import SiteGate
from meteorseed_scrapy.politeness.policy import Backoff, SiteLimits
from meteorseed_scrapy.politeness.robotstxt import robots_interval
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.sites.model import Limits
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.schema import parse_site, rule_schema
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.validators import ConfigError

T = TypeVar("T")




def adapt(client: redis.Redis, key: str, samples: list[tuple[float, bool]], *,
          target: float = 2.0, start: float = 5000.0, low: float = 0.0, high: float = 60000.0,
          interval: int = 0) -> tuple[float, str]:
    """One flush of ``samples`` ((latency ms, a 200?)) to lua/adaptive.lua."""
    good = [ms for ms, ok in samples if ok]
    delay, latency = scripts.register(client, "adaptive")(
        keys=[key], args=[len(samples), sum(ms for ms, _ in samples), len(good), sum(good),
                          target, start, low, high, interval, 600_000])
    return float(delay), latency


# -- lua/adaptive.lua: Scrapy's rule, fleet-wide ------------------------------------------------

def test_the_delay_starts_at_the_start_delay_and_halves_toward_latency_over_target(
        sync_redis: redis.Redis, namespace: str) -> None:
    key = f"{namespace}:{{s}}:adaptive"
    # latency 100 ms, target 2: want 50 ms; from 5000 ms: halfway, as Scrapy's AutoThrottle
    assert adapt(sync_redis, key, [(100, True)] * 4)[0] == pytest.approx(2525)
    assert adapt(sync_redis, key, [(100, True)])[0] == pytest.approx(1287.5)
    delay, latency = adapt(sync_redis, key, [(300, True), (100, True)])
    assert delay == pytest.approx((1287.5 + 100) / 2)
    assert float(latency) == pytest.approx(200)


def test_a_slower_site_raises_the_delay_at_once(sync_redis: redis.Redis,
                                                namespace: str) -> None:
    key = f"{namespace}:{{s}}:adaptive"
    adapt(sync_redis, key, [(100, True)], start=60)  # 60 -> want 50: 55
    assert adapt(sync_redis, key, [(1000, True)])[0] == pytest.approx(500)


def test_errors_and_5xx_never_lower_the_delay(sync_redis: redis.Redis, namespace: str) -> None:
    key = f"{namespace}:{{s}}:adaptive"
    assert adapt(sync_redis, key, [(10, False)] * 5, start=1000)[0] == 1000
    # ... but a slow error answer raises it (as Scrapy: a non-200 only may not lower it)
    assert adapt(sync_redis, key, [(4000, False)])[0] == pytest.approx(2000)
    # lowering reads the 200s alone: a fast 500 does not drag the mean down
    assert adapt(sync_redis, key, [(1000, True), (1, False)])[0] == pytest.approx(1250)


def test_the_delay_stays_within_download_delay_and_max_delay(sync_redis: redis.Redis,
                                                             namespace: str) -> None:
    key = f"{namespace}:{{s}}:adaptive"
    assert adapt(sync_redis, key, [(1e6, True)], high=3000)[0] == 3000
    other = f"{namespace}:{{t}}:adaptive"
    for _ in range(20):
        delay = adapt(sync_redis, other, [(1, True)], low=250)[0]
    assert delay == 250


def test_samples_of_a_window_are_combined_from_every_flush_before_the_update(
        sync_redis: redis.Redis, namespace: str) -> None:
    key = f"{namespace}:{{s}}:adaptive"
    # Within the interval the workers' flushes only add up; nothing moves the delay yet.
    for ms in (100, 300):
        assert adapt(sync_redis, key, [(ms, True)], interval=3_600_000)[0] == 5000
    state = sync_redis.hgetall(key)
    assert (state["n"], float(state["sum"])) == ("2", 400.0)
    assert "updates" not in state
    sync_redis.hset(key, "at", 0)  # the window is over
    assert adapt(sync_redis, key, [], interval=1000)[0] == pytest.approx((5000 + 100) / 2)
    assert sync_redis.hget(key, "n") == "0"


@pytest.mark.parametrize("damage", [{"delay": "nan"}, {"delay": "inf"}, {"delay": "-5"},
                                    {"delay": "x"}, {"n": "-1e400"}, {"sum": "1e999"}])
def test_a_damaged_state_reads_as_new_not_as_a_stall(sync_redis: redis.Redis, namespace: str,
                                                      damage: dict[str, str]) -> None:
    key = f"{namespace}:{{s}}:adaptive"
    sync_redis.hset(key, mapping=damage)
    delay = adapt(sync_redis, key, [(100, True)], start=1000)[0]
    assert 50 <= delay <= 1000 and math.isfinite(delay)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(windows=st.lists(st.lists(st.tuples(st.floats(0, 1e7), st.booleans()), max_size=6),
                        min_size=1, max_size=8),
       target=st.floats(0.01, 100), low=st.floats(0, 5000), span=st.floats(1, 1e6))
@example(windows=[[(0.0, True)]], target=0.01, low=0.0, span=1.0)
def test_property_the_delay_is_finite_within_bounds_and_errors_never_lower_it(
        sync_redis: redis.Redis, namespace: str, windows: list[list[tuple[float, bool]]],
        target: float, low: float, span: float) -> None:
    key = f"{namespace}:{{p}}:adaptive"
    sync_redis.delete(key)
    high = low + span
    delay = min(max(low, 1000.0), high)
    for samples in windows:
        new = adapt(sync_redis, key, samples, target=target, start=1000, low=low, high=high)[0]
        assert math.isfinite(new) and low - 1e-6 <= new <= high * (1 + 1e-9)
        if samples and not any(ok for _, ok in samples):
            assert new >= delay - 1e-6 * max(1.0, delay)
        delay = new


# -- the gate grants at the adaptive delay -------------------------------------------------------

def adaptive_limits(**kw: Any) -> SiteLimits:
    throttle = AdaptiveTarget(target=kw.pop("target", 2.0), start_delay=kw.pop("start", 0.5))
    base: dict[str, Any] = {"rate": 1000.0, "burst": 1000, "concurrency": 100, "adaptive": True,
                            "throttle": throttle}
    base.update(kw)
    return SiteLimits(**base)


def make_gate(client: Any, ns: str, limits: SiteLimits) -> SiteGate:
    return SiteGate(client, KeyLayout(ns), lambda _site: limits, "c1", Backoff(1.0, 300.0))


def test_an_adaptive_site_starts_at_the_start_delay_with_a_burst_of_the_target(
        redis_url: str, namespace: str) -> None:
    async def main(client: Any) -> tuple[int, float, int]:
        gate = make_gate(client, namespace, adaptive_limits(start=0.5))
        first = await gate.acquire("s", 50)
        second = await gate.acquire("s", 50)
        plain = make_gate(client, namespace + "x", SiteLimits(1000.0, 1000, 100))
        return len(first.lease_ids), second.wait_s, len((await plain.acquire("s", 50)).lease_ids)

    granted, wait_s, plain = run(redis_url, main)
    assert granted == 2  # burst: the target (2), not the configured 1000
    assert 0.2 < wait_s <= 0.5  # then one per start delay (0.5 s), not 1000 a second
    assert plain == 50


def test_the_gate_follows_the_fleet_delay_and_caps_concurrency_at_twice_the_target(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    sync_redis.hset(f"{namespace}:{{s}}:adaptive", "delay", "0.001")

    async def main(client: Any) -> int:
        gate = make_gate(client, namespace, adaptive_limits(target=1.5, burst=1000))
        total = 0
        for _ in range(50):  # tokens come at 1e6/s: the concurrency cap is what stops it
            total += len((await gate.acquire("s", 10)).lease_ids)
        return total

    assert run(redis_url, main) == 3  # ceil(2 * 1.5) in flight at most


def test_the_configured_rate_and_concurrency_stay_ceilings(redis_url: str, namespace: str,
                                                           sync_redis: redis.Redis) -> None:
    sync_redis.hset(f"{namespace}:{{s}}:adaptive", "delay", "0.001")

    async def main(client: Any) -> tuple[int, float]:
        gate = make_gate(client, namespace, adaptive_limits(target=50, rate=1.0, burst=1,
                                                            concurrency=100))
        got = len((await gate.acquire("s", 10)).lease_ids)
        return got, (await gate.acquire("s", 10)).wait_s

    got, wait_s = run(redis_url, main)
    assert got == 1 and wait_s > 0.5  # 1 a second, as configured, however fast the site


def test_flushed_samples_move_the_delay_once_per_window(redis_url: str, namespace: str,
                                                        sync_redis: redis.Redis) -> None:
    async def main(client: Any) -> list[float]:
        gate = make_gate(client, namespace, adaptive_limits(target=2.0, start=5.0))
        for ms in (80, 120):
            gate.observe("s", ms / 1000, 200)
        gate.observe("s", 0.001, 503)
        gate.observe("s", float("nan"), 200)  # no figure: no sample
        first = await gate.flush_samples(force=True)
        assert not gate.samples
        await client.hset(f"{namespace}:{{s}}:adaptive", "at", 0)  # the window is over
        gate.observe("s", 0.1, 200)
        second = await gate.flush_samples(force=True)
        return [first["s"].delay_s, second["s"].delay_s]

    first, second = run(redis_url, main)
    assert first == 5.0  # the first window has just begun
    # window: 3 responses (100, 120, 80 ms and a fast 503), mean of the 200s lowers it
    assert second == pytest.approx((5.0 + 0.1 / 2) / 2, rel=1e-3)
    assert sync_redis.zscore(f"{namespace}:adaptive", "s") is not None


def test_a_site_not_adaptive_records_no_samples(redis_url: str, namespace: str) -> None:
    async def main(client: Any) -> bool:
        gate = make_gate(client, namespace, SiteLimits(1000.0, 1000, 100))
        gate.observe("s", 0.1, 200)
        return bool(gate.samples)

    assert run(redis_url, main) is False


def test_refused_state_keeps_the_samples_for_the_next_flush(redis_url: str, namespace: str,
                                                            sync_redis: redis.Redis) -> None:
    sync_redis.set(f"{namespace}:{{s}}:adaptive", "not a hash")

    async def main(client: Any) -> tuple[dict[str, Any], bool]:
        gate = make_gate(client, namespace, adaptive_limits())
        gate.observe("s", 0.1, 200)
        return await gate.flush_samples(force=True), bool(gate.samples)

    assert run(redis_url, main) == ({}, True)


def test_latency_samples_skip_what_is_not_a_latency() -> None:
    samples = LatencySamples()
    for bad in (float("nan"), float("inf"), -1.0):
        samples.add("s", bad, True)
    assert not samples
    samples.add("s", 0.25, False)
    assert samples.take() == {"s": [1, 250.0, 0, 0.0]}


# -- robots.txt caps -----------------------------------------------------------------------------

OBEYING = SiteLimits(1000.0, 1000, 100, crawl_delay=True)


def test_until_robots_txt_is_read_one_request_goes_at_a_time(redis_url: str,
                                                             namespace: str) -> None:
    async def main(client: Any) -> tuple[int, int, bool, int, int]:
        gate = make_gate(client, namespace, OBEYING)
        first = len((await gate.acquire("s", 50)).lease_ids)
        held = len((await gate.acquire("s", 50)).lease_ids)  # the first is still in flight
        capped = await gate.cap_by_robots("s", "a.example", None)  # read: no rate asked
        after = 0
        for _ in range(200):  # the bucket refills at the configured 1000/s
            after += len((await gate.acquire("s", 50)).lease_ids)
            if after >= 10:
                break
        ignoring = make_gate(client, namespace + "i", SiteLimits(1000.0, 1000, 100))
        return first, held, capped, after, len((await ignoring.acquire("s", 50)).lease_ids)

    first, held, capped, after, ignoring = run(redis_url, main)
    assert (first, held, capped) == (1, 0, False)
    assert after >= 10  # robots.txt read: the site's own limits again
    assert ignoring == 50  # robots not obeyed: never held back


def test_crawl_delay_caps_the_fleet_rate_with_a_burst_of_one(redis_url: str,
                                                             namespace: str) -> None:
    async def main(client: Any) -> tuple[bool, int, float]:
        gate = make_gate(client, namespace, OBEYING)
        capped = await gate.cap_by_robots("s", "a.example", 0.5)
        first = await gate.acquire("s", 50)
        return capped, len(first.lease_ids), (await gate.acquire("s", 50)).wait_s

    capped, granted, wait_s = run(redis_url, main)
    assert capped and granted == 1 and 0.3 < wait_s <= 0.5


def test_the_longest_interval_of_a_sites_hosts_wins(redis_url: str, namespace: str) -> None:
    async def main(client: Any) -> float:
        gate = make_gate(client, namespace, OBEYING)
        await gate.cap_by_robots("s", "a.example", 0.1)
        await gate.cap_by_robots("s", "b.example", 2.0)
        await gate.acquire("s", 1)
        return (await gate.acquire("s", 1)).wait_s

    assert 1.5 < run(redis_url, main) <= 2.0


def test_a_rule_config_that_ignores_crawl_delay_is_not_capped(redis_url: str,
                                                              namespace: str) -> None:
    limits = OBEYING.overridden(Limits(ignore_crawl_delay="the owner allows us 50/s"))
    assert limits.crawl_delay is False
    assert OBEYING.overridden(Limits(), robots=False).crawl_delay is False
    assert OBEYING.overridden(Limits()).crawl_delay is True

    async def main(client: Any) -> tuple[bool, int]:
        obeying = make_gate(client, namespace, OBEYING)
        await obeying.cap_by_robots("s", "a.example", 5.0)  # another worker recorded it
        gate = make_gate(client, namespace, limits)
        return (await gate.cap_by_robots("s", "a.example", 5.0),
                len((await gate.acquire("s", 50)).lease_ids))

    assert run(redis_url, main) == (False, 50)


@pytest.mark.parametrize(("text", "expected"), [
    ("User-agent: *\nCrawl-delay: 0.5\n", 0.5),
    ("User-agent: *\nRequest-rate: 3/10s\n", 10 / 3),
    ("User-agent: *\nCrawl-delay: 1\nRequest-rate: 1/5s\n", 5.0),
    ("User-agent: *\nDisallow: /x\n", None),
    ("User-agent: *\nCrawl-delay: -3\n", None),
    ("User-agent: *\nCrawl-delay: nan\n", None),
    ("User-agent: *\nCrawl-delay: inf\n", None),
    ("User-agent: *\nRequest-rate: 0/0s\n", None),
    ("User-agent: other\nCrawl-delay: 9\n", None),
])
def test_robots_interval_reads_crawl_delay_and_request_rate(text: str,
                                                            expected: float | None) -> None:
    class Parser:
        rp = Protego.parse(text)

    got = robots_interval(Parser(), "mybot")
    assert got == (pytest.approx(expected) if expected is not None else None)
    assert robots_interval(object(), "mybot") is None  # a parser that cannot tell


# -- the add-on's hand-over, settings and the rule format ----------------------------------------

def addon_settings(**values: Any) -> Settings:
    settings = Settings()
    for name, value in values.items():
        settings.set(name, value, priority="project")
    MeteorSeedAddon().update_settings(settings)
    return settings


def test_the_addon_hands_autothrottle_over_to_the_fleet_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="meteorseed_scrapy.addon"):
        settings = addon_settings(AUTOTHROTTLE_ENABLED=True, AUTOTHROTTLE_TARGET_CONCURRENCY=3)
    assert settings.getbool("AUTOTHROTTLE_ENABLED") is False
    assert settings.getbool("METEORSEED_ADAPTIVE") is True
    assert "per-process AutoThrottle is off" in caplog.text
    limits = SiteLimits.from_settings(settings)
    assert limits.adaptive and limits.throttle.target == 3 and limits.throttle.concurrency == 6
    # -s AUTOTHROTTLE_ENABLED=1 on the command line wins over the project: handed over too
    cmdline = Settings()
    cmdline.set("AUTOTHROTTLE_ENABLED", "1", priority="cmdline")
    MeteorSeedAddon().update_settings(cmdline)
    assert not cmdline.getbool("AUTOTHROTTLE_ENABLED") and cmdline.getbool("METEORSEED_ADAPTIVE")


def test_without_autothrottle_or_when_told_not_to_the_addon_leaves_it_alone() -> None:
    assert addon_settings().getbool("METEORSEED_ADAPTIVE") is False
    kept = addon_settings(AUTOTHROTTLE_ENABLED=True, METEORSEED_ADAPTIVE=False)
    assert kept.getbool("AUTOTHROTTLE_ENABLED") and not kept.getbool("METEORSEED_ADAPTIVE")
    local = addon_settings(AUTOTHROTTLE_ENABLED=True, METEORSEED_POLITENESS=False)
    assert local.getbool("AUTOTHROTTLE_ENABLED")
    with pytest.raises(ConfigError, match="AUTOTHROTTLE_ENABLED"):
        addon_settings(AUTOTHROTTLE_ENABLED="maybe")


@pytest.mark.parametrize(("name", "value"), [
    ("AUTOTHROTTLE_TARGET_CONCURRENCY", 0), ("AUTOTHROTTLE_TARGET_CONCURRENCY", "nan"),
    ("AUTOTHROTTLE_TARGET_CONCURRENCY", -1), ("AUTOTHROTTLE_MAX_DELAY", 0),
    ("AUTOTHROTTLE_START_DELAY", "soon"), ("AUTOTHROTTLE_MAX_DELAY", "1e999"),
    ("DOWNLOAD_DELAY", -1), ("AUTOTHROTTLE_TARGET_CONCURRENCY", 1e9),
])
def test_bad_autothrottle_values_are_refused_naming_the_setting(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        SiteLimits.from_settings(Settings({name: value}))


def test_max_delay_below_download_delay_is_refused() -> None:
    with pytest.raises(ConfigError, match="AUTOTHROTTLE_MAX_DELAY"):
        AdaptiveTarget.from_settings(Settings({"DOWNLOAD_DELAY": 5, "AUTOTHROTTLE_MAX_DELAY": 1}))


RULE = {"site_id": "s", "version": 1, "start": "detail", "fields": {"title": {"css": "h1"}}}


def test_a_site_rule_turns_adaptive_on_or_off_over_the_project() -> None:
    on = parse_site(dict(RULE, limits={"adaptive": True}), "s.yaml").limits
    off = parse_site(dict(RULE, limits={"adaptive": False}), "s.yaml").limits
    unset = parse_site(dict(RULE, limits={}), "s.yaml").limits
    project = SiteLimits(2.0, 5, 4, adaptive=True)
    assert SiteLimits(2.0, 5, 4).overridden(on).adaptive is True
    assert project.overridden(off).adaptive is False
    assert project.overridden(unset).adaptive is True
    limits = rule_schema()["properties"]["limits"]["anyOf"][1]["properties"]
    assert {"adaptive", "ignore_crawl_delay"} <= set(limits)


@pytest.mark.parametrize(("limits", "field"), [
    ({"adaptive": "yes"}, "limits.adaptive"), ({"adaptive": 1}, "limits.adaptive"),
    ({"adaptive": "true"}, "limits.adaptive"), ({"adaptive": []}, "limits.adaptive"),
    ({"ignore_crawl_delay": ""}, "limits.ignore_crawl_delay"),
    ({"ignore_crawl_delay": "   "}, "limits.ignore_crawl_delay"),
    ({"ignore_crawl_delay": "ok"}, "limits.ignore_crawl_delay"),
    ({"ignore_crawl_delay": "why\nnot"}, "limits.ignore_crawl_delay"),
    ({"ignore_crawl_delay": "trailing newline\n"}, "limits.ignore_crawl_delay"),
    ({"ignore_crawl_delay": "x" * 201}, "limits.ignore_crawl_delay"),
    ({"ignore_crawl_delay": True}, "limits.ignore_crawl_delay"),
    ({"ignore_crawl_delay": ["a reason"]}, "limits.ignore_crawl_delay"),
    ({"ignore_crawl_delay": "tab\tinside"}, "limits.ignore_crawl_delay"),
])
def test_adversarial_adaptive_values_are_refused_naming_the_field(limits: dict[str, Any],
                                                                   field: str) -> None:
    with pytest.raises(RuleError, match=field.replace(".", r"\.")):
        parse_site(dict(RULE, limits=limits), "s.yaml")


@settings(max_examples=80, deadline=None)
@given(reason=st.text(max_size=250))
def test_property_an_ignore_reason_is_kept_exactly_or_refused_naming_the_field(
        reason: str) -> None:
    try:
        got = parse_site(dict(RULE, limits={"ignore_crawl_delay": reason}), "s.yaml")
    except RuleError as exc:
        assert "limits.ignore_crawl_delay" in str(exc)
    else:
        assert got.limits.ignore_crawl_delay == reason
        assert reason.strip() and 3 <= len(reason) <= 200 and "\n" not in reason


# -- the state, as meteorseed status / GET /status / the metrics read it ------------------------

def test_status_lists_each_sites_target_rate_latency_in_flight_and_robots_cap(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    from meteorseed_scrapy.queue.inspect.status import read_status

    async def main(client: Any) -> None:
        gate = make_gate(client, namespace, adaptive_limits(target=2.0, start=5.0,
                                                            crawl_delay=True))
        await gate.cap_by_robots("a", "a.example", 2.0)
        await gate.acquire("a", 1)
        gate.observe("a", 0.1, 200)
        await gate.flush_samples(force=True)

    run(redis_url, main)
    keys = KeyLayout(namespace)
    sync_redis.zadd(keys.adaptive_sites, {"damaged": 1.0})
    sync_redis.hset(f"{namespace}:{{damaged}}:adaptive", mapping={"delay": "nan",
                                                                 "latency": "x"})
    sync_redis.set(f"{namespace}:{{damaged}}:robots", "not a hash")
    status = read_status(sync_redis, keys)
    rows = {t.site_id: t for t in status.throttles}
    a = rows["a"]
    assert a.delay_s == 5.0 and a.robots_interval_s == 2.0 and a.in_flight == 1
    assert a.target_rate == pytest.approx(0.2)  # the slower of 1/5 s and 1/2 s
    assert rows["damaged"].delay_s is None and rows["damaged"].target_rate is None
    (shown,) = [t for t in status.to_json()["throttles"] if t["site_id"] == "a"]
    assert shown == {"site_id": "a", "target_rate": 0.2, "delay_s": 5.0, "latency_ms": None,
                     "in_flight": 1, "robots_interval_s": 2.0}


# -- the middlewares that feed it ---------------------------------------------------------------

class FakeGate:
    def __init__(self, fail: int = 0) -> None:
        self.observed: list[tuple[str, float, int]] = []
        self.capped: list[tuple[str, str, float | None]] = []
        self.fail = fail

    def observe(self, site: str, latency: float, status: int) -> None:
        self.observed.append((site, latency, status))

    async def cap_by_robots(self, site: str, host: str, interval: float | None) -> bool:
        if self.fail:
            self.fail -= 1
            raise redis.exceptions.ResponseError("WRONGTYPE")
        self.capped.append((site, host, interval))
        return interval is not None


def test_the_middleware_samples_task_responses_with_a_latency_only() -> None:
    from scrapy import Request
    from scrapy.http import HtmlResponse

    from meteorseed_scrapy.politeness.adaptive import AdaptiveThrottleMiddleware
    from meteorseed_scrapy.task.context import TASK_META_KEY
    from meteorseed_scrapy.task.exec_task import ExecTask

    task = ExecTask.create(seed_id="s", site_id="site", url="http://a.example/1")
    gate = FakeGate()
    mw = AdaptiveThrottleMiddleware(SimpleNamespace(worker=True, gate=gate))  # type: ignore[arg-type]

    def response(**meta: Any) -> None:
        request = Request(task.url, meta=meta)
        mw.process_response(request, HtmlResponse(task.url, status=503, request=request))

    response(**{TASK_META_KEY: task, "download_latency": 0.2})
    response(**{TASK_META_KEY: task})  # no latency: no sample
    response(**{TASK_META_KEY: task, "download_latency": 0.2,
                "autothrottle_dont_adjust_delay": True})
    response(download_latency=0.2)  # no task: not a site's
    assert gate.observed == [("site", 0.2, 503)]


def test_robots_middleware_records_each_hosts_interval_once_and_retries_a_refused_one() -> None:
    from scrapy import Request, Spider
    from scrapy.utils.test import get_crawler

    from meteorseed_scrapy.politeness.robotstxt import RobotsTxtMiddleware
    from meteorseed_scrapy.sites.lookup import SITE_META_KEY

    crawler = get_crawler(Spider, {"ROBOTSTXT_OBEY": True})
    mw = RobotsTxtMiddleware(crawler)
    gate = FakeGate(fail=1)
    mw.runtime.gate = gate  # type: ignore[assignment]
    mw.runtime.open_worker()

    class Parser:
        rp = Protego.parse("User-agent: *\nCrawl-delay: 0.5\n")

    async def main() -> None:
        for _ in range(3):
            await mw._cap(Parser(), Request("http://a.example/x", meta={SITE_META_KEY: "s"}))
        await mw._cap(None, Request("http://b.example/x", meta={SITE_META_KEY: "s"}))

    asyncio.run(main())
    # refused once (logged), recorded by the next request, then not asked again; a host whose
    # robots.txt could not be read is recorded as read, with no cap
    assert gate.capped == [("s", "a.example", 0.5), ("s", "b.example", None)]


def test_meteorseed_status_prints_each_sites_adaptive_state_escaped(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    import io

    from meteorseed_scrapy.cli import main

    keys = KeyLayout(namespace)
    hostile = "evil\x1b[2Jsite"  # a quota key from Redis must not reach the terminal raw
    for site in ("news", hostile):
        sync_redis.zadd(keys.adaptive_sites, {site: 1.0})
        sync_redis.hset(keys.site(site, "adaptive"), mapping={"delay": "250", "latency": "500"})
    sync_redis.hset(keys.site("news", "robots"), "news.test", "1000")
    out = io.StringIO()
    code = main(["status", "--redis-url", redis_url, "--namespace", namespace],
                stdin=io.StringIO(), stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    assert code == 0 and "\x1b" not in text and "evil\\x1b[2Jsite" in text
    line = next(x for x in text.splitlines() if x.startswith("news"))
    assert "1/s" in line and "500 ms" in line and "1 s" in line  # robots' 1 s wins over 4/s
    row = next(x for x in text.splitlines() if "evil" in x)
    assert "4/s" in row


def test_the_adaptive_limit_and_robots_caps_work_on_a_cluster(cluster: Any, ns: str) -> None:
    """Every script call stays in the site's slot; the status index is its own command."""
    from meteorseed_scrapy.queue.inspect.status import read_status
    from meteorseed_scrapy.queue.plumbing.connection import sync_client
    from tests.test_cluster import run as run_on
    from tests.test_cluster import sites_on_distinct_nodes

    sites = sites_on_distinct_nodes(cluster, 2)
    limits = adaptive_limits(target=2.0, start=0.5, crawl_delay=True)

    async def body(client: Any) -> dict[str, Any]:
        gate = make_gate(client, ns, limits)
        out = {}
        for site in sites:
            await gate.cap_by_robots(site, "h.example", 1.0)
            granted = len((await gate.acquire(site, 5)).lease_ids)
            gate.observe(site, 0.1, 200)
            flushed = await gate.flush_samples(force=True)
            out[site] = (granted, flushed[site].delay_s)
        return out

    result = run_on(cluster.url, body, decode_responses=True)
    assert result == {site: (1, 0.5) for site in sites}
    client = sync_client(cluster.url, decode_responses=True)
    try:
        rows = {t.site_id: t for t in read_status(client, KeyLayout(ns, cluster=True)).throttles}
    finally:
        client.close()
    assert {s: (rows[s].robots_interval_s, rows[s].in_flight) for s in sites} == {
        s: (1.0, 1) for s in sites}

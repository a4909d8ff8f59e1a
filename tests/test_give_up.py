"""A site's continuous trouble is timed fleet-wide in Redis; after METEORSEED_GIVE_UP_AFTER (a
batch crawl: at most 60 s) its waiting tasks are given up on (real redis-server)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
import redis
from scrapy.settings import Settings
from scrapy.statscollectors import MemoryStatsCollector

from meteorseed_scrapy.politeness.breaker import Breaker, BreakerConfig
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import DEFAULTS
from meteorseed_scrapy.testing.clients import run_with_client as run
from meteorseed_scrapy.validators import ConfigError

T = TypeVar("T")
SOON = BreakerConfig(give_up=0.0)  # any trouble at all is enough
NEVER = BreakerConfig(give_up=10**9)




def breaker(client: Any, ns: str, config: BreakerConfig = SOON) -> Breaker:
    stats = MemoryStatsCollector(SimpleNamespace(settings=Settings()))
    return Breaker(client, KeyLayout(ns), config, stats)


async def flush(*breakers: Breaker) -> None:
    for b in breakers:
        b._next_flush = 0.0  # flush now (it paces itself four times a second)
        await b.flush()


def test_a_throttled_site_is_given_up_on_by_every_worker_with_the_time_it_began(
    redis_url: str, namespace: str
) -> None:
    async def scenario(client: Any) -> tuple[str, str, float | None]:
        one, two = breaker(client, namespace), breaker(client, namespace)
        one.throttled("s")
        await flush(one)
        two.record("s", error=False, latency_s=0.1, probe=False)  # a 429 is no good answer
        await flush(two)
        return one.given_up("s"), two.given_up("s"), two.give_up_in("s")

    first, second, left = run(redis_url, scenario)
    assert first.startswith("site down since 20") and "gave up after 0s" in first
    assert second.startswith("site down since 20")
    assert left == 0.0


def test_a_good_answer_anywhere_ends_the_trouble_for_the_fleet(
    redis_url: str, namespace: str
) -> None:
    async def scenario(client: Any) -> tuple[str, float | None, float | None]:
        one, two = breaker(client, namespace), breaker(client, namespace)
        one.throttled("s")
        await flush(one)
        two.record("s", error=False, latency_s=0.1, probe=False, good=True)
        await flush(two, one)
        return one.given_up("s"), one.give_up_in("s"), two.give_up_in("s")

    assert run(redis_url, scenario) == ("", None, None)


def test_trouble_not_yet_long_enough_brings_tasks_back_by_the_give_up_time(
    redis_url: str, namespace: str
) -> None:
    async def scenario(client: Any) -> tuple[str, float | None, float | None]:
        b = breaker(client, namespace, NEVER)
        before = b.give_up_in("s")
        b.throttled("s")
        await flush(b)
        return b.given_up("s"), before, b.give_up_in("s")

    reason, before, left = run(redis_url, scenario)
    assert reason == "" and before is None
    assert left is not None and 0 < left <= 10**9


def test_an_open_breaker_is_trouble_and_stays_so_while_it_is_open(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.site_own("s", "s", "breaker"), mapping={"state": "open", "since": 0})

    async def scenario(client: Any) -> tuple[str, str]:
        b = breaker(client, namespace)
        b.state["s"] = "open"
        await flush(b)
        b.record("s", error=False, latency_s=0.1, probe=False, good=True)  # open: no matter
        await flush(b)
        return b.state["s"], b.given_up("s")

    state, reason = run(redis_url, scenario)
    assert state == "open" and reason.startswith("site down since ")


@pytest.mark.parametrize("garbage", ["", "soon", "-", "1e400x", "\x00"])
def test_a_corrupt_trouble_start_is_started_afresh(
    redis_url: str, namespace: str, sync_redis: redis.Redis, garbage: str
) -> None:
    key = KeyLayout(namespace).site_own("s", "s", "trouble")
    sync_redis.set(key, garbage)

    async def scenario(client: Any) -> float | None:
        b = breaker(client, namespace, NEVER)
        b.throttled("s")
        await flush(b)
        return b.give_up_in("s")

    left = run(redis_url, scenario)
    assert left is not None and left > 10**9 - 60  # began now, not at a garbage time
    assert int(str(sync_redis.get(key))) > 0


def test_a_trouble_start_of_the_wrong_type_fails_that_site_alone(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    sync_redis.rpush(KeyLayout(namespace).site_own("bad", "bad", "trouble"), "x")

    async def scenario(client: Any) -> tuple[str, str]:
        b = breaker(client, namespace)
        b.throttled("bad")
        b.throttled("good")
        await flush(b)
        return b.given_up("bad"), b.given_up("good")

    bad, good = run(redis_url, scenario)
    assert bad == "" and good.startswith("site down since ")


@pytest.mark.parametrize(("settings", "give_up"), [
    ({}, DEFAULTS["METEORSEED_GIVE_UP_AFTER"]),  # a continuous fleet
    ({"METEORSEED_IDLE_CLOSE": 3}, 60),  # a batch crawl must end
    ({"METEORSEED_IDLE_CLOSE": 3, "METEORSEED_GIVE_UP_AFTER": 10}, 10),
    ({"METEORSEED_IDLE_CLOSE": 3, "METEORSEED_BATCH_GIVE_UP_AFTER": "5m"}, 300),
    ({"METEORSEED_IDLE_CLOSE": 3, "METEORSEED_BATCH_GIVE_UP_AFTER": 2.5}, 2.5),
    ({"METEORSEED_BATCH_GIVE_UP_AFTER": 5}, DEFAULTS["METEORSEED_GIVE_UP_AFTER"]),  # no batch
    ({"METEORSEED_GIVE_UP_AFTER": "2h"}, 7200),
])
def test_the_give_up_time_of_a_fleet_and_of_a_batch_crawl(
    settings: dict[str, Any], give_up: float
) -> None:
    assert BreakerConfig.from_settings(Settings({**DEFAULTS, **settings})).give_up == give_up


@pytest.mark.parametrize("name", ["METEORSEED_GIVE_UP_AFTER", "METEORSEED_BATCH_GIVE_UP_AFTER"])
@pytest.mark.parametrize("value", [0, -5, "soon", "never", "1e400", float("nan"), "60 s s"])
def test_a_bad_give_up_time_is_an_error_naming_the_setting(name: str, value: Any) -> None:
    # (the batch bound is checked on a continuous fleet too: a typo waits for no batch crawl)
    with pytest.raises(ConfigError, match=name):
        BreakerConfig.from_settings(Settings({**DEFAULTS, name: value}))

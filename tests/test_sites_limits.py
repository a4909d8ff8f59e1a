"""A rule file's ``limits`` cross a trust boundary (files, ``meteorseed sites push``, Redis):
every value is either a finite number within range, or the file is refused naming the field.
Before, ``rate: 0``, ``.inf`` and ``.nan`` were accepted and made lua/gate.lua fail on every
call; ``concurrency: .nan`` crashed the loader with a bare ValueError."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.politeness.policy import SiteLimits
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.lookup import SiteConfigs
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.sites.rulefile import load_file, parse_text
from meteorseed_scrapy.sites.schema import LIMITS, parse_site
from meteorseed_scrapy.testing.polling import wait_for
from tests.test_politeness_gate import make_gate, run

NEWS = Path(__file__).resolve().parents[1] / "example_project" / "sites" / "news.yaml"
KEYS = sorted(LIMITS)


def site(limits: dict[str, Any]) -> dict[str, Any]:
    return {"site_id": "s", "version": 1, "start": "detail", "fields": {"title": "h1::text"},
            "limits": limits}


def news_with(limits: str) -> str:
    text = NEWS.read_text()
    old = next(line for line in text.splitlines() if line.startswith("limits:"))
    return text.replace(old, f"limits: {limits}")


def check_outcome(key: str, value: Any, parse: Any) -> None:
    """Accepted as a finite number in range equal to ``value``, or refused naming the field."""
    try:
        config = parse()
    except RuleError as exc:
        assert exc.path == f"limits.{key}", exc
        return
    got = getattr(config.limits, key)
    least, most, whole = LIMITS[key]
    assert not isinstance(value, bool) and isinstance(value, (int, float))
    assert isinstance(got, int if whole else float) and not isinstance(got, bool)
    assert math.isfinite(got) and least <= got <= most and got == value
    assert got > 0 or key == "retries"


VALUES = st.one_of(
    st.integers(), st.integers(min_value=10**15, max_value=10**400), st.floats(),
    st.sampled_from([0, 0.0, -0.0, math.nan, math.inf, -math.inf, 1e-300, 5e-324, 1e308,
                     10**400, True, False, None, "2", "", ".nan", [], {}]),
    st.text(max_size=10), st.booleans(), st.none(),
)


@settings(max_examples=400, deadline=None)
@given(key=st.sampled_from(KEYS), value=VALUES)
@example(key="rate", value=0).via("the issue")
@example(key="rate", value=math.inf).via("the issue")
@example(key="rate", value=math.nan).via("the issue")
@example(key="concurrency", value=math.nan).via("crashed the loader")
@example(key="burst", value=math.inf).via("crashed the loader")
def test_any_limits_value_is_accepted_in_range_or_refused_naming_the_field(
        key: str, value: Any) -> None:
    check_outcome(key, value, lambda: parse_site(site({key: value}), "s.yaml"))


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(KEYS), value=VALUES, suffix=st.sampled_from([".yaml", ".json"]))
def test_the_same_holds_for_the_text_of_a_rule_file(key: str, value: Any, suffix: str) -> None:
    data = site({key: value})
    text = json.dumps(data) if suffix == ".json" else yaml.safe_dump(data)
    # JSON writes nan / inf as NaN / Infinity, which json.loads reads back: the worst case.
    check_outcome(key, value, lambda: parse_text(text, suffix, f"s{suffix}"))


@pytest.mark.parametrize(("limits", "problem"), [
    ("{rate: 0}", "limits.rate: must be a positive finite number, got 0"),
    ("{rate: .inf}", "limits.rate: must be a positive finite number, got inf"),
    ("{rate: .nan}", "limits.rate: must be a positive finite number, got nan"),
    ("{rate: -0.0}", "limits.rate: must be a positive finite number, got -0.0"),
    ("{rate: ~}", "limits.rate: must be a positive finite number, got None"),
    ("{rate: '2'}", "limits.rate: must be a positive finite number, got '2'"),
    ("{rate: true}", "limits.rate: must be a positive finite number, got True"),
    ("{rate: 1.0e-300}", "limits.rate: must be between 1e-05 and 1e+06, got 1e-300"),
    ("{rate: 1" + "0" * 400 + "}", "limits.rate: must be between 1e-05 and 1e+06, got a "),
    ("{burst: 0}", "limits.burst: must be a positive finite number, got 0"),
    ("{burst: 2.5}", "limits.burst: must be a whole number, got 2.5"),
    ("{burst: 100001}", "limits.burst: must be between 1 and 10000, got 100001"),
    ("{concurrency: .nan}", "limits.concurrency: must be a positive finite number, got nan"),
    ("{concurrency: -.inf}", "limits.concurrency: must be a positive finite number, got -inf"),
    ("{timeout: 0}", "limits.timeout: must be a positive finite number, got 0"),
    ("{timeout: 1.0e+9}", "limits.timeout: must be between 0 and 86400, got 1000000000.0"),
    ("{retries: -1}", "limits.retries: must be a finite number >= 0, got -1"),
    ("{retries: .inf}", "limits.retries: must be a finite number >= 0, got inf"),
])
def test_named_bad_limits_are_refused_naming_file_and_field(
        tmp_path: Path, limits: str, problem: str) -> None:
    path = tmp_path / "example_news.yaml"
    path.write_text(news_with(limits))
    with pytest.raises(RuleError) as info:
        load_file(path)
    assert str(info.value).startswith(f"{path}: {problem}")


def test_good_limits_are_kept_exactly(tmp_path: Path) -> None:
    path = tmp_path / "example_news.yaml"
    path.write_text(news_with("{rate: 0.5, burst: 3.0, concurrency: 2, timeout: 1.5,"
                              " retries: 0}"))
    limits = load_file(path).limits
    assert (limits.rate, limits.burst, limits.concurrency, limits.timeout, limits.retries) \
        == (0.5, 3, 2, 1.5, 0)
    assert isinstance(limits.burst, int)


def rewrite(path: Path, text: str) -> None:
    stamp = path.stat().st_mtime_ns + 5_000_000_000  # a new stamp whatever the mtime grain
    path.write_text(text)
    os.utime(path, ns=(stamp, stamp))


def test_hot_reload_keeps_the_last_good_limits_of_that_site_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "example_news.yaml").write_text(news_with("{rate: 3}"))
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(site({"rate": 1})))
    configs = SiteConfigs(tmp_path, interval=0.0001)
    asyncio.run(configs.refresh())
    assert configs.get("example_news").limits.rate == 3.0  # type: ignore[union-attr]
    with caplog.at_level(logging.ERROR, logger="meteorseed_scrapy.sites.loader"):
        rewrite(tmp_path / "example_news.yaml", news_with("{rate: 0}"))
        rewrite(tmp_path / "other.yaml", yaml.safe_dump(site({"rate": 7})))
        wait_for(lambda: asyncio.run(configs.refresh()) or configs.get("s").limits.rate == 7)
    assert "keeping the last good version 1 of site example_news" in caplog.text
    assert "example_news.yaml: limits.rate: must be a positive finite number, got 0" \
        in caplog.text
    assert configs.get("example_news").limits.rate == 3.0  # type: ignore[union-attr]


def sites_cli(redis_url: str, namespace: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["sites", argv[0], "--redis-url", redis_url, "--namespace", namespace,
                 *argv[1:]], stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_sites_push_refuses_bad_limits_and_stores_nothing(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    (tmp_path / "example_news.yaml").write_text(news_with("{rate: .nan, burst: 5}"))
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(site({"rate": 1})))
    code, _, err = sites_cli(redis_url, namespace, "push", str(tmp_path))
    assert code != 0
    assert "example_news.yaml: limits.rate: must be a positive finite number, got nan" in err
    assert sync_redis.hlen(KeyLayout(namespace).sites) == 0


def test_a_pushed_entry_with_bad_limits_keeps_the_last_good_version(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    (tmp_path / "example_news.yaml").write_text(news_with("{rate: 3}"))
    remote = RemoteRules.from_url(redis_url, keys)
    try:
        assert sites_cli(redis_url, namespace, "push", str(tmp_path))[0] == 0
        registry = SiteRegistry(None, remote).load()
        assert registry.get("example_news").limits.rate == 3.0  # type: ignore[union-attr]
        record = json.loads(sync_redis.hget(keys.sites, "example_news"))  # type: ignore[arg-type]
        record["text"] = news_with("{rate: .inf}")  # a hand edit past the push's validation
        sync_redis.hset(keys.sites, "example_news", json.dumps(record))
        sync_redis.incr(keys.sites_rev)
        registry.apply(registry.poll())
        assert registry.get("example_news").limits.rate == 3.0  # type: ignore[union-attr]
        assert registry.errors == 1
    finally:
        remote.close()


SCENARIOS = itertools.count()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rate=st.sampled_from([LIMITS["rate"][0], 1.0, LIMITS["rate"][1]]),
       burst=st.sampled_from([1, int(LIMITS["burst"][1])]),
       concurrency=st.sampled_from([1, int(LIMITS["concurrency"][1])]),
       ramp=st.booleans())
def test_every_accepted_extreme_keeps_the_gate_working(
        redis_url: str, namespace: str, rate: float, burst: int, concurrency: int,
        ramp: bool) -> None:
    """The ranges exist for gate.lua: at the slowest rate, with a 429's tightening and the
    breaker's first ramp step, its bucket TTL and wait are still integers Redis takes."""
    config = parse_site(site({"rate": rate, "burst": burst, "concurrency": concurrency}), "s")
    limits = SiteLimits(rate=2.0, burst=5, concurrency=4).overridden(config.limits)
    keys = KeyLayout(namespace)
    site_id = f"x{next(SCENARIOS)}"

    async def scenario(client: Any) -> tuple[int, float]:
        gate = make_gate(client, namespace, limits)
        await client.set(keys.site(site_id, "tighten"), "0.5")
        if ramp:
            await client.hset(keys.site_own(site_id, site_id, "breaker"),
                              mapping={"state": "ramp", "step": 1})
        first = await gate.acquire(site_id, 1)
        await gate.release((site_id, lease) for lease in first.lease_ids)
        # A drained bucket that cannot refill: the gate's "no token, when to ask again" path.
        await client.hset(keys.site(site_id, "bucket"), mapping={"tokens": 0, "ts": 2**50})
        second = await gate.acquire(site_id, 1)
        return len(first.lease_ids), second.wait_s

    granted, wait_s = run(redis_url, scenario)
    assert granted == 1 and wait_s > 0

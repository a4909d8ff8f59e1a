"""settings.py: every METEORSEED_* default in one table, one accessor, one number validator,
one duration grammar, and invalid values that stop a crawl naming the setting."""

from __future__ import annotations

import ast
import asyncio
import itertools
import math
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Spider
from scrapy.exceptions import NotConfigured
from scrapy.settings import Settings

import meteorseed_scrapy
from meteorseed_scrapy import settings as settings_module
from meteorseed_scrapy.observability.metrics import MetricsExtension
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import DEFAULTS, MAX_SHARDS, WorkerConfig, setting, store_uri_from
from meteorseed_scrapy.validators import (
    UNITS,
    ConfigError,
    format_duration,
    parse_duration,
    to_flag,
    to_integer,
    to_number,
)

PACKAGE = Path(meteorseed_scrapy.__file__).parent
NAME = re.compile(r"METEORSEED_[A-Z0-9_]+")
#: METEORSEED_* names in the package that are not settings, and why.
NOT_SETTINGS = {
    # A secret for `meteorseed serve` only (env or --token); no Scrapy component reads it.
    "METEORSEED_API_TOKEN": "environment variable of meteorseed serve",
    # Where the test harness finds a redis-server binary (meteorseed_scrapy.testing).
    "METEORSEED_REDIS_SERVER": "environment variable of the test harness",
    "METEORSEED_POSTGRES_BIN": "environment variable of the test harness",
}
#: The defaults /work/shared/CONTRACT.md promises.
CONTRACT = {
    "METEORSEED_NAMESPACE": "meteorseed",
    "METEORSEED_IDLE_CLOSE": 0,
    "METEORSEED_MAX_DELIVERIES": 5,
    "METEORSEED_GIVE_UP_AFTER": 86400,
    "METEORSEED_FETCH_PRIVATE_ADDRESSES": False,
    "METEORSEED_SITE_RATE": 2.0,
    "METEORSEED_SITE_BURST": 5,
    "METEORSEED_SITE_CONCURRENCY": 4,
    "METEORSEED_MAX_BACKLOG": 1_000_000,
    "METEORSEED_BACKOFF_BASE": 1,
    "METEORSEED_BACKOFF_MAX": 300,
    "METEORSEED_BREAKER_WINDOW": 60,
    "METEORSEED_BREAKER_MIN_REQUESTS": 20,
    "METEORSEED_BREAKER_ERROR_RATIO": 0.3,
    "METEORSEED_BREAKER_PROBE_INTERVAL": 60,
}


def _defaults_span() -> tuple[int, int]:
    """Lines of the DEFAULTS table in settings.py (the table does not count as a reader)."""
    tree = ast.parse((PACKAGE / "settings.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "DEFAULTS":
            assert node.end_lineno is not None
            return node.lineno, node.end_lineno
    raise AssertionError("no DEFAULTS table in settings.py")


def names_in_source() -> set[str]:
    """Every METEORSEED_* name in the package's source, DEFAULTS itself left out. A name
    ending in ``_`` is a documented family (``METEORSEED_SCHEDULE_*``), not a name."""
    start, end = _defaults_span()
    found: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        lines = path.read_text().splitlines()
        if path == PACKAGE / "settings.py":
            lines = lines[:start - 1] + lines[end:]
        found.update(n for n in NAME.findall("\n".join(lines)) if not n.endswith("_"))
    return found


def test_every_setting_the_code_names_has_a_default() -> None:
    missing = names_in_source() - set(DEFAULTS) - set(NOT_SETTINGS)
    assert not missing, f"METEORSEED_* names without an entry in settings.DEFAULTS: {missing}"


def test_every_default_is_a_setting_the_code_names() -> None:
    # (a contract setting is in the table by contract, even while its reader is being written)
    unread = set(DEFAULTS) - names_in_source() - set(CONTRACT)
    assert not unread, f"settings.DEFAULTS entries nothing reads: {unread}"
    assert not set(NOT_SETTINGS) & set(DEFAULTS)


def test_the_contract_defaults_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CONTRACT.items():
        assert DEFAULTS[name] == value, name
        assert isinstance(DEFAULTS[name], bool) == isinstance(value, bool), name
    assert DEFAULTS["METEORSEED_CLAIM_IDLE"] in (30, 10)  # 30 today; the performance aim is 10
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("MONGO_URL", raising=False)
    assert WorkerConfig.from_settings(Settings()).redis_url == "redis://127.0.0.1:6379/0"
    assert store_uri_from(Settings()) == "sqlite:///meteorseed.db"
    monkeypatch.setenv("REDIS_URL", "redis://env:1/0")
    monkeypatch.setenv("MONGO_URL", "mongodb://env/db")
    assert WorkerConfig.from_settings(Settings()).redis_url == "redis://env:1/0"
    assert store_uri_from(Settings()) == "mongodb://env/db"


def test_settings_sits_at_the_bottom_of_the_package() -> None:
    allowed = {"settings.py": {"meteorseed_scrapy.scrapy_redis_settings",
                               "meteorseed_scrapy.validators"},
               "validators.py": set(), "scrapy_redis_settings.py": set()}
    for name, may in allowed.items():
        tree = ast.parse((PACKAGE / name).read_text())
        imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert {m for m in imported if m.startswith("meteorseed_scrapy")} <= may, name


# -- the accessor ------------------------------------------------------------------------------

def test_setting_reads_any_settings_like_source_and_falls_back_to_the_default() -> None:
    name = "METEORSEED_MAX_BACKLOG"
    for source in (Settings(), {}, {name: ""}, {name: None}, Settings({name: ""}).get):
        assert setting(source, name) == 1_000_000
    for source in (Settings({name: "7"}), {name: "7"}, {name: "7"}.get):
        assert setting(source, name) == "7"
    with pytest.raises(KeyError, match="METEORSEED_NO_SUCH"):
        setting({}, "METEORSEED_NO_SUCH")


def test_the_addon_puts_every_default_in_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from scrapy.utils.test import get_crawler

    monkeypatch.delenv("METEORSEED_CHROMIUM_PATH", raising=False)  # (conftest: the tests')
    crawler = get_crawler(settings_dict={
        "ADDONS": {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}, "METEORSEED_SITE_RATE": 9})
    for name, value in DEFAULTS.items():
        expected = 9 if name == "METEORSEED_SITE_RATE" else value
        assert crawler.settings.get(name) == expected, name


# -- numbers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    "", " ", "abc", "nan", "NaN", "inf", "-inf", "infinity", "1e400", "9" * 5000, "0x10",
    "1_000", "1,5", "\u0661\u0662", "5 5", "--1", True, False, None, [], {}, object(),
    float("nan"), float("inf"), -float("inf"),
])
def test_numbers_refuse_garbage_naming_the_setting(value: Any) -> None:
    for check in (to_number, to_integer):
        with pytest.raises(ConfigError) as info:
            check(value, "METEORSEED_X")
        assert info.value.name == "METEORSEED_X" and str(info.value).startswith("METEORSEED_X: ")


def test_number_bounds_and_whole_numbers() -> None:
    assert to_number(" 2.5 ", "X") == 2.5 and to_number("1e3", "X") == 1000.0
    assert to_integer("2.0", "X") == 2 and to_integer(7, "X") == 7
    with pytest.raises(ConfigError, match=r"X: expected a whole number, got '1\.5'"):
        to_integer("1.5", "X")
    with pytest.raises(ConfigError, match="X: must be > 0, got 0"):
        to_number(0, "X", positive=True)
    with pytest.raises(ConfigError, match="X: must be >= 1, got '0'"):
        to_integer("0", "X", minimum=1)
    with pytest.raises(ConfigError, match=r"X: must be <= 1, got 1\.5"):
        to_number(1.5, "X", maximum=1)
    assert to_integer("-3", "X", minimum=-math.inf) == -3


@given(st.one_of(st.text(max_size=30), st.floats(allow_nan=True, allow_infinity=True),
                 st.integers(), st.booleans(), st.none()))
def test_numbers_are_finite_and_in_range_or_refused(value: Any) -> None:
    try:
        number = to_number(value, "N", minimum=-5, maximum=1e6)
    except ConfigError as exc:
        assert exc.name == "N"
    else:
        assert math.isfinite(number) and -5 <= number <= 1e6
    try:
        whole = to_integer(value, "N", minimum=0)
    except ConfigError as exc:
        assert exc.name == "N"
    else:
        assert type(whole) is int and whole >= 0


def test_flags_read_what_scrapy_getbool_reads_and_refuse_the_rest() -> None:
    for value in (True, False, 0, 1, "0", "1", "True", "False", "true", "false"):
        assert to_flag(value, "F") is Settings({"F": value}).getbool("F")
    for value in ("yes", "", "2", 2, None, "maybe"):
        with pytest.raises(ConfigError, match="F: expected true or false"):
            to_flag(value, "F")


# -- the duration grammar ----------------------------------------------------------------------

amounts = st.integers(min_value=0, max_value=10**7)
units = st.sampled_from(sorted(UNITS))
spaces = st.sampled_from(["", " ", "  "])


@given(amounts, units, spaces, spaces)
def test_one_unit(amount: int, unit: str, before: str, after: str) -> None:
    text = f"{before}{amount}{before}{unit}{after}"
    assert parse_duration(text, "D") == amount * UNITS[unit]


@given(st.lists(st.tuples(units, amounts), min_size=1, unique_by=lambda p: p[0]), spaces)
def test_parts_largest_unit_first_add_up(parts: list[tuple[str, int]], gap: str) -> None:
    parts.sort(key=lambda p: -UNITS[p[0]])
    text = gap.join(f"{amount}{unit}" for unit, amount in parts)
    assert parse_duration(text, "D") == sum(amount * UNITS[unit] for unit, amount in parts)


@given(st.lists(units, min_size=2, max_size=4).filter(
    lambda us: any(UNITS[a] <= UNITS[b] for a, b in itertools.pairwise(us))))
def test_parts_out_of_order_or_repeated_are_refused(order: list[str]) -> None:
    with pytest.raises(ConfigError, match="D: expected seconds or a duration"):
        parse_duration("".join(f"1{unit}" for unit in order), "D")


@given(st.floats(min_value=0, max_value=1e9))
def test_format_duration_reads_back(seconds: float) -> None:
    assert parse_duration(format_duration(seconds), "D") == round(seconds)


@given(st.floats(min_value=0, max_value=1e12))
def test_plain_numbers_are_seconds(seconds: float) -> None:
    assert parse_duration(seconds, "D") == seconds
    assert parse_duration(repr(seconds), "D") == seconds


@given(st.one_of(st.text(max_size=20),
                 st.text(alphabet="0123456789.smhdw -+eE", max_size=12),
                 st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                 st.booleans(), st.none(), st.lists(st.integers(), max_size=2)))
def test_anything_is_a_finite_non_negative_duration_or_refused_by_name(value: Any) -> None:
    try:
        seconds = parse_duration(value, "--older-than")
    except ConfigError as exc:
        assert exc.name == "--older-than" and str(exc).startswith("--older-than: ")
    else:
        assert math.isfinite(seconds) and seconds >= 0


@pytest.mark.parametrize("value", [
    "", "   ", "nan", "inf", "-inf", "-1", "-1s", "1h-30m", "1e400", "1" + "0" * 400 + "w",
    "2W", "1H", "1,5h", "\u0661s", "m", "h30", "30m1h", "1h1h", "1 week", "3 weeks", "0x10s",
    "1_000s", "1.5e2s", True, None, [], -0.5, float("nan"), float("inf"),
])
def test_nasty_durations_are_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "METEORSEED_CLAIM_IDLE")
    assert info.value.name == "METEORSEED_CLAIM_IDLE"


@pytest.mark.parametrize(("text", "seconds"), [
    ("2w", 1_209_600), ("1d12h", 129_600), ("1d 12h", 129_600), ("1.5h", 5400), (".5m", 30),
    ("45", 45), (" 10m ", 600), ("0", 0), ("5.", 5), ("1w2d3h4m5s", 788_645),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "D") == seconds


def test_every_user_of_the_grammar_takes_weeks() -> None:
    from meteorseed_scrapy.seeding.schedule import Every, parse_schedule
    from meteorseed_scrapy.sites.reader import Reader

    assert parse_schedule("every 2w") == Every(1_209_600.0)
    assert Reader({"w": "2w"}, "f.yaml").duration("w", None) == 1_209_600
    worker = WorkerConfig.from_settings(Settings({"METEORSEED_CLAIM_IDLE": "1m",
                                                  "METEORSEED_IDLE_CLOSE": "1h30m"}))
    assert (worker.claim_idle, worker.idle_close) == (60, 5400)


# -- invalid values stop the crawl; NotConfigured only switches a component off ---------------

def test_key_layout_from_settings_names_the_setting() -> None:
    keys = KeyLayout.from_settings(Settings({"METEORSEED_NAMESPACE": "ns",
                                             "METEORSEED_STREAM_SHARDS": "4",
                                             "METEORSEED_REDIS_URL": "redis+cluster://h:1"}))
    assert (keys.namespace, keys.shards, keys.cluster) == ("ns", 4, True)
    config = WorkerConfig.from_settings(Settings({"METEORSEED_STREAM_SHARDS": 2}))
    assert KeyLayout.for_config(config) == KeyLayout("meteorseed", 2)
    for name, value in (("METEORSEED_NAMESPACE", "a b"), ("METEORSEED_NAMESPACE", "{x}"),
                        ("METEORSEED_STREAM_SHARDS", 0), ("METEORSEED_STREAM_SHARDS", "x"),
                        ("METEORSEED_STREAM_SHARDS", MAX_SHARDS + 1)):
        with pytest.raises(ConfigError) as info:
            KeyLayout.from_settings(Settings({name: value}))
        assert info.value.name == name


def test_metrics_switch_off_without_a_port_but_refuse_a_bad_one() -> None:
    from scrapy.utils.test import get_crawler

    with pytest.raises(NotConfigured):
        MetricsExtension.from_crawler(get_crawler(settings_dict={"METEORSEED_METRICS_PORT": 0}))
    for port in ("x", "-1", "70000", "80.5"):
        with pytest.raises(ConfigError, match="METEORSEED_METRICS_PORT"):
            MetricsExtension.from_crawler(get_crawler(
                settings_dict={"METEORSEED_METRICS_PORT": port}))


def test_config_error_survives_pickling() -> None:
    import pickle

    error = pickle.loads(pickle.dumps(ConfigError("METEORSEED_X", "bad")))
    assert (error.name, error.problem, str(error)) == ("METEORSEED_X", "bad", "METEORSEED_X: bad")


class IdleSpider(Spider):
    name = "idle"

    async def start(self) -> AsyncIterator[Any]:
        return
        yield


def crawl_error(extra: dict[str, Any]) -> ConfigError | None:
    """Run a crawl in-process (the add-on, a Redis nobody listens on, ``extra``) and return the
    ConfigError it failed with, wherever it is in the chain of what the crawl raised."""
    from scrapy.utils.test import get_crawler

    async def crawl() -> None:
        crawler = get_crawler(IdleSpider, {
            "ADDONS": {"meteorseed_scrapy.addon.MeteorSeedAddon": 0},
            "METEORSEED_REDIS_URL": "redis://127.0.0.1:9/0",
            "DOWNLOAD_HANDLERS": {"http": None, "https": None},  # nothing is downloaded
            **extra})
        await crawler.crawl_async()

    try:
        asyncio.run(crawl())
    except Exception as exc:
        error: BaseException | None = exc
        while error is not None and not isinstance(error, ConfigError):
            error = error.__cause__ or error.__context__
        return error
    return None


@pytest.mark.parametrize(("name", "value"), [
    ("METEORSEED_CLAIM_IDLE", "abc"),  # the scheduler
    ("METEORSEED_PROXY_MAX_FAILURES", "many"),  # a downloader middleware (was: disabled)
    ("METEORSEED_BREAKER_ERROR_RATIO", "2"),  # the scheduler's breaker
    ("METEORSEED_STORE_BATCH_SIZE", "0"),  # the item pipeline
    ("METEORSEED_LOG_JSON", "perhaps"),  # an extension
])
def test_a_crawl_with_an_invalid_setting_fails_naming_it(
        name: str, value: str, caplog: pytest.LogCaptureFixture) -> None:
    error = crawl_error({name: value})
    assert isinstance(error, ConfigError) and error.name == name, error
    if name == "METEORSEED_CLAIM_IDLE":  # named in the log before Scrapy buries it
        assert f"the crawl cannot start: {name}: " in caplog.text


def test_os_environ_is_a_settings_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METEORSEED_MAX_BACKLOG", "12")
    assert settings_module.integer_setting(os.environ, "METEORSEED_MAX_BACKLOG") == 12
    monkeypatch.setenv("METEORSEED_MAX_BACKLOG", "-1")
    with pytest.raises(ConfigError, match="METEORSEED_MAX_BACKLOG: must be >= 0"):
        settings_module.integer_setting(os.environ, "METEORSEED_MAX_BACKLOG")


@pytest.mark.parametrize("value", [10**400, -(10**400), 10**5000, 2**63, "1" * 500],
                         ids=["1e400", "-1e400", "1e5000", "2**63", "500 ones"])
@pytest.mark.parametrize("parse", [to_number, to_integer, parse_duration])
def test_huge_numbers_are_refused_naming_the_field(parse: Any, value: Any) -> None:
    # math.isfinite() overflows on such ints and repr() of >4300 digits raises: both were
    # crashes where a refusal naming the field belongs.
    if parse is not to_integer and value == 2**63:
        assert parse(value, "limits.rate") == float(2**63)
        return
    with pytest.raises(ConfigError, match=r"^limits\.rate"):
        parse(value, "limits.rate")

"""InterpreterTuning: the worker's switch interval and collection threshold applied while it
runs and given back after; a bad value is an error naming the setting."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import pytest
from scrapy.settings import Settings

from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.interpreter import InterpreterTuning


def _tuning(**values: object) -> InterpreterTuning:
    return InterpreterTuning.from_settings(Settings({"METEORSEED_FREEZE_GC": False, **values}))


def test_the_switch_interval_is_the_workers_while_it_runs_and_pythons_after() -> None:
    before = sys.getswitchinterval()
    tuning = _tuning()  # the default
    tuning.started()
    try:
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        tuning.started()  # (twice: still given back to Python's own)
    finally:
        tuning.stopped()
    assert sys.getswitchinterval() == pytest.approx(before)
    tuning.stopped()  # (nothing to give back twice)
    assert sys.getswitchinterval() == pytest.approx(before)


@pytest.mark.parametrize(("name", "read"), [("METEORSEED_SWITCH_INTERVAL", sys.getswitchinterval),
                                             ("METEORSEED_GC_THRESHOLD", gc.get_threshold)])
def test_zero_leaves_the_interpreters_own(name: str, read: Callable[[], object]) -> None:
    before = read()
    tuning = _tuning(**{name: 0})
    tuning.started()
    assert read() == before
    tuning.stopped()


@pytest.mark.parametrize("value", [-0.001, "fast", 1, float("nan"), float("inf")])
def test_a_bad_switch_interval_names_the_setting(value: object) -> None:
    with pytest.raises(ConfigError, match="METEORSEED_SWITCH_INTERVAL"):
        _tuning(METEORSEED_SWITCH_INTERVAL=value)


def test_the_collection_threshold_is_the_workers_while_it_runs_and_pythons_after() -> None:
    before = gc.get_threshold()
    tuning = _tuning()  # the default
    tuning.started()
    try:
        assert gc.get_threshold() == (10_000, *before[1:])
        tuning.started()  # (twice: still given back to Python's own)
    finally:
        tuning.stopped()
    assert gc.get_threshold() == before
    tuning.stopped()
    assert gc.get_threshold() == before


@pytest.mark.parametrize("value", [-1, "often", 2.5, 10_000_000])
def test_a_bad_collection_threshold_names_the_setting(value: object) -> None:
    with pytest.raises(ConfigError, match="METEORSEED_GC_THRESHOLD"):
        _tuning(METEORSEED_GC_THRESHOLD=value)

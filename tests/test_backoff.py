"""The one exponential backoff (meteorseed_scrapy/backoff.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy.backoff import exponential

seconds = st.floats(min_value=1e-3, max_value=1e4)


@given(st.integers(min_value=-5, max_value=10**6), seconds, seconds)
def test_doubles_from_first_up_to_the_cap_and_never_overflows(attempt: int, first: float,
                                                              cap: float) -> None:
    delay = exponential(attempt, first, cap)
    assert delay == min(cap, first * 2.0 ** max(0, min(attempt, 60)))
    assert delay <= cap
    assert exponential(attempt + 1, first, cap) >= delay


@given(st.integers(min_value=0, max_value=40), seconds, seconds, seconds)
def test_a_floor_such_as_retry_after_wins_below_the_cap(attempt: int, first: float, cap: float,
                                                       floor: float) -> None:
    assert exponential(attempt, first, cap, floor=floor) == min(cap, max(floor,
                                                                         exponential(attempt,
                                                                                     first, cap)))


@given(st.integers(min_value=0, max_value=40), seconds, seconds,
       st.floats(min_value=0.0, max_value=1.0), st.floats(min_value=1.0, max_value=2.0))
def test_jitter_scales_the_delay_within_its_bounds(attempt: int, first: float, cap: float,
                                                   low: float, high: float) -> None:
    plain = exponential(attempt, first, cap)
    jittered = exponential(attempt, first, cap, jitter=(low, high))
    assert plain * low * (1 - 1e-12) <= jittered <= plain * high * (1 + 1e-12)


def test_the_first_retry_waits_first() -> None:
    assert exponential(0, 0.25, 30.0) == 0.25
    assert exponential(3, 0.25, 30.0) == 2.0
    assert exponential(10, 0.25, 30.0) == 30.0

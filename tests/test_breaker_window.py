"""This worker's judgement of a site (``Breaker.local_abnormal``) against the whole window read
afresh, over random download histories: the running error count it keeps must give the same
answer as counting every entry."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.politeness import breaker as breaker_module
from meteorseed_scrapy.politeness.breaker import MIN_FAILING_TASKS, Breaker, BreakerConfig
from meteorseed_scrapy.queue.keys import KeyLayout

WINDOW = 10.0
CONFIG = BreakerConfig(window=WINDOW, min_requests=8, error_ratio=0.5, max_latency=2.0)

# (seconds since the previous download, error, latency s, task)
DOWNLOADS = st.lists(
    st.tuples(st.sampled_from([0.0, 0.5, 3.0, 11.0]), st.booleans(),
              st.sampled_from([0.1, 1.0, 5.0]), st.sampled_from(["a", "b", "c", "d"])),
    max_size=60,
)


@contextmanager
def clock_at(start: float) -> Iterator[list[float]]:
    """The breaker module's clock, set by hand: ``clock[0]`` is the monotonic time it reads.
    (A context rather than the ``monkeypatch`` fixture: Hypothesis runs many examples in one
    test call.)"""
    clock = [start]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(breaker_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
        yield clock


def judged_afresh(history: deque[tuple[float, bool, float, str]], now: float) -> bool:
    """The judgement read from every entry younger than the window."""
    entries = [e for e in history if e[0] >= now - WINDOW]
    n = len(entries)
    if n < max(3, -(-CONFIG.min_requests // 4)):
        return False
    if len({task for _, e, _, task in entries if e}) < MIN_FAILING_TASKS:
        return False
    errors = sum(1 for _, e, _, _ in entries if e)
    mean = sum(lat for _, _, lat, _ in entries) / n
    return errors / n > CONFIG.error_ratio or mean > CONFIG.max_latency


@settings(max_examples=300, deadline=None)
@given(DOWNLOADS, st.lists(st.integers(min_value=0, max_value=59), max_size=10))
def test_local_judgement_matches_the_whole_window(downloads: list[tuple[float, bool, float, str]],
                                                  asks: list[int]) -> None:
    with clock_at(1000.0) as clock:
        b = Breaker(redis.Redis(), KeyLayout("ns"), CONFIG, None)
        history: deque[tuple[float, bool, float, str]] = deque()
        for i, (gap, error, latency, task) in enumerate(downloads):
            clock[0] += gap
            b.record("site", error, latency, False, task)
            history.append((clock[0], error, latency, task))
            if i in asks:
                assert b.local_abnormal("site") is judged_afresh(history, clock[0])
        clock[0] += 0.5
        assert b.local_abnormal("site") is judged_afresh(history, clock[0])
        live = [e for e in history if e[0] >= clock[0] - WINDOW]
        if "site" in b._local:
            assert b._local["site"].errors == sum(1 for e in live if e[1])


def test_a_site_failing_on_many_tasks_is_abnormal_and_recovers_as_errors_age_out() -> None:
    with clock_at(0.0) as clock:
        b = Breaker(redis.Redis(), KeyLayout("ns"), CONFIG, None)
        for task in "abcd":
            b.record("site", True, 0.1, False, task)
        assert b.local_abnormal("site")
        clock[0] += WINDOW + 1
        for task in "abcd":
            b.record("site", False, 0.1, False, task)
        assert not b.local_abnormal("site")
        assert b._local["site"].errors == 0

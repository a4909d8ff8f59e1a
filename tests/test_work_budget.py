"""WorkBudget: tasks worth reading, permits worth leasing, scrapes in progress."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scrapy.settings import Settings

from meteorseed_scrapy.queue.consume.delivery import Delivery
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.validators import ConfigError
from meteorseed_scrapy.worker.fate import WhatHappened
from meteorseed_scrapy.worker.ledger import Entry, TaskLedger
from meteorseed_scrapy.worker.work_budget import WorkBudget, WorkSizes


def book(ledger: TaskLedger, n: int) -> Entry:
    task = ExecTask.create(seed_id="s", site_id="site", url=f"https://site.test/{n}")
    entry = ledger.add(Delivery("ns:tasks", f"1-{n}", {}, 1, task))
    assert entry is not None
    return entry


def sizes_from(**settings: object) -> WorkSizes:
    return WorkSizes.from_settings(Settings(settings))


class Downloads:
    def __init__(self) -> None:
        self.active = 0

    def __call__(self) -> int:
        return self.active


def budget(capacity: int = 8, max_settling: int | None = None) -> tuple[WorkBudget, TaskLedger,
                                                                           Downloads]:
    ledger, downloads = TaskLedger(), Downloads()
    sizes = WorkSizes(capacity, max_settling or capacity)
    return WorkBudget(ledger, sizes, downloads), ledger, downloads


def test_sizes_follow_the_capacity() -> None:
    sizes = sizes_from(CONCURRENT_REQUESTS=16)
    assert (sizes.prefetch, sizes.read_batch, sizes.max_settling) == (8, 4, 16)
    tiny = sizes_from(CONCURRENT_REQUESTS=1)
    assert (tiny.prefetch, tiny.read_batch, tiny.max_settling) == (1, 1, 2)


def test_want_is_capacity_plus_prefetch_less_what_holds_a_download() -> None:
    work, ledger, downloads = budget(8)
    assert work.want() == 12
    entries = [book(ledger, n) for n in range(5)]
    assert work.want() == 12  # read but not started: they hold no download yet
    for entry in entries[:3]:
        entry.started = True
    assert work.want() == 9
    downloads.active = 5  # the downloader knows of more (e.g. hops)
    assert work.want() == 7
    downloads.active = 0
    entries[0].response_at = 1.0  # waiting for its commit only: no download capacity held
    assert work.want() == 10
    downloads.active = 40
    assert work.want() == 0  # never negative


def test_settling_counts_scrapes_whose_verdict_is_not_in() -> None:
    work, ledger, _ = budget(8, max_settling=2)
    a, b, c = (book(ledger, n) for n in range(3))
    for entry in (a, b, c):
        entry.started = True
    assert work.settling() == 0 and work.may_dispatch()
    a.response_at = b.response_at = 1.0
    assert work.settling() == 2 and not work.may_dispatch()
    ledger.finish_scrape(a.task.task_id, WhatHappened(a.task))
    assert work.settling() == 1 and work.may_dispatch()


def test_downloads_in_flight_count_against_max_settling() -> None:
    # On a fast site every download is a response in the scraper a moment later: counting
    # only the responses already there let the whole downloader through at each finished scrape.
    work, ledger, downloads = budget(8, max_settling=3)
    a = book(ledger, 0)
    a.started = True
    a.response_at = 1.0
    downloads.active = 1
    assert work.settling() == 1 and work.may_dispatch()
    downloads.active = 2
    assert not work.may_dispatch()
    ledger.finish_scrape(a.task.task_id, WhatHappened(a.task))
    assert work.may_dispatch()


def test_permits_cover_free_capacity_and_a_quarter_ahead() -> None:
    work, _, downloads = budget(8)
    assert work.permits(held=0) == 10
    assert work.permits(held=4) == 6
    downloads.active = 8
    assert work.permits(held=0) == 2  # the permits ahead, for the next free slot
    assert work.permits(held=5) == 0


def test_max_settling_defaults_to_the_download_capacity() -> None:
    assert sizes_from(CONCURRENT_REQUESTS=24).max_settling == 24
    assert sizes_from(CONCURRENT_REQUESTS=24, METEORSEED_MAX_SETTLING="").max_settling == 24
    assert sizes_from(CONCURRENT_REQUESTS=24, METEORSEED_MAX_SETTLING="5").max_settling == 5
    assert sizes_from(METEORSEED_MAX_SETTLING=1).max_settling == 2  # at least two


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "many", "nan", "inf", [3], True])
def test_a_bad_max_settling_names_the_setting(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        sizes_from(METEORSEED_MAX_SETTLING=value)
    assert info.value.name == "METEORSEED_MAX_SETTLING"


@given(st.text(max_size=20))
def test_any_max_settling_text_is_a_count_or_an_error_naming_it(text: str) -> None:
    try:
        sizes = sizes_from(CONCURRENT_REQUESTS=8, METEORSEED_MAX_SETTLING=text)
    except ConfigError as exc:
        assert exc.name == "METEORSEED_MAX_SETTLING"
    else:
        assert sizes.max_settling >= 2
        assert sizes.max_settling == (8 if not text else max(2, int(float(text.strip()))))


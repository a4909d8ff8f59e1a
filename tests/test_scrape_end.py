"""Scrape.when_done: the end of a scrape, told once and only once it is certain."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy.task.context import Output, Scrape
from meteorseed_scrapy.task.exec_task import ExecTask


def _scrape() -> tuple[Scrape, list[int]]:
    scrape = Scrape(ExecTask.create(seed_id="s", site_id="x", url="https://example.com/a"))
    calls: list[int] = []
    scrape.when_done(lambda: calls.append(1))
    return scrape, calls


def test_done_once_the_output_ran_out_and_every_output_is_through() -> None:
    scrape, calls = _scrape()
    a, b = Output(scrape), Output(scrape)
    scrape.output_yielded()
    scrape.output_yielded()
    a.done()
    scrape.output_exhausted()
    assert calls == []  # b is still in the item pipelines
    b.done()
    b.done()  # (through once: the store stage, then the scraper's end of it)
    assert calls == [1]


def test_a_callback_that_yields_nothing_is_done_when_its_output_ends() -> None:
    scrape, calls = _scrape()
    scrape.output_exhausted()
    assert calls == [1]


def test_never_done_with_an_error_nor_without_the_end_of_the_output() -> None:
    scrape, calls = _scrape()
    out = Output(scrape)
    scrape.output_yielded()
    out.done()
    assert calls == []  # the callback may yield more
    scrape.fail("item not committed: StoreWriteError")
    scrape.output_exhausted()
    assert calls == []  # Scrapy's own end of the scrape settles it (as failed)


# An operation: ("yield",), ("through", k) for the k-th output yielded so far, ("fail",),
# ("end",) for the end of the callback's output.
_ops = st.lists(st.one_of(st.just(("yield", 0)), st.tuples(st.just("through"), st.integers(0, 30)),
                          st.just(("fail", 0)), st.just(("end", 0))), max_size=60)


@given(_ops)
def test_done_exactly_when_certain_whatever_the_order(ops: list[tuple[str, int]]) -> None:
    scrape, calls = _scrape()
    outputs: list[Output] = []
    ended = failed = False
    for op, k in ops:
        if op == "yield" and not ended:
            scrape.output_yielded()
            outputs.append(Output(scrape))
        elif op == "through" and outputs:
            outputs[k % len(outputs)].done()
        elif op == "fail":
            scrape.fail("boom")
            failed = True
        elif op == "end" and not ended:
            ended = True
            scrape.output_exhausted()
        certain = ended and not failed and all(o.through for o in outputs)
        # Told at the first moment it is certain, never before, never twice.
        assert len(calls) <= 1
        if not calls:
            assert not certain
    if ended and not failed and all(o.through for o in outputs):
        assert calls == [1]

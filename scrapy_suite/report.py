"""The comparison of the two runs, and the Markdown summary of it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from scrapy_suite.results import Difference, Outcome, Run

MESSAGE_WIDTH = 160


@dataclass
class Comparison:
    #: pass on stock, fail with the add-on, not in differences.txt: these fail the run
    unexpected: list[Outcome] = field(default_factory=list)
    #: fail with the add-on as differences.txt says
    known: list[tuple[Outcome, Difference]] = field(default_factory=list)
    #: listed in differences.txt but pass with the add-on now
    now_pass: list[Difference] = field(default_factory=list)
    #: listed in differences.txt but not among the tests run
    absent: list[Difference] = field(default_factory=list)
    #: fail on stock Scrapy too (not the add-on's doing)
    stock_failures: list[Outcome] = field(default_factory=list)
    #: unexpected failures that passed when run once more (they do not fail the run)
    flaky: list[Outcome] = field(default_factory=list)


def compare(stock: Run, addon: Run, differences: dict[str, Difference]) -> Comparison:
    result = Comparison()
    for nodeid, outcome in sorted(addon.outcomes.items()):
        if stock.failed(nodeid):
            result.stock_failures.append(stock.outcomes[nodeid])
        elif addon.failed(nodeid):
            if nodeid in differences:
                result.known.append((outcome, differences[nodeid]))
            elif stock.passed(nodeid) or nodeid not in stock.outcomes:
                result.unexpected.append(outcome)
    files_run = {outcome.file for outcome in addon.outcomes.values()}
    for nodeid, difference in sorted(differences.items()):
        if nodeid not in addon.outcomes:
            # (a test of a file left out of this run is not reported)
            if nodeid.split("::", 1)[0] in files_run:
                result.absent.append(difference)
        elif addon.passed(nodeid):
            result.now_pass.append(difference)
    return result


def _short(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else ""
    line = line.replace("|", "\\|")
    return line if len(line) <= MESSAGE_WIDTH else line[:MESSAGE_WIDTH - 1] + "…"


def _how(outcome: Outcome) -> str:
    if outcome.outcome == "not run":
        return "not run (the run died before it)"
    if outcome.timeout:
        return f"hung (> timeout): {_short(outcome.message)}"
    cause = f"; log: {_short(outcome.cause)}" if outcome.cause else ""
    return _short(outcome.message) + cause


def _entry(outcome: Outcome) -> str:
    return f"- `{outcome.nodeid}`: {_how(outcome)}"


def _section(title: str, entries: Iterable[str]) -> list[str]:
    return [title, "", *entries, ""]


def table(files: list[str], stock: Run, addon: Run) -> list[str]:
    lines = ["| file | stock passed | failed | skipped | add-on passed | failed | skipped |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name in [*files, None]:
        row = []
        for run in (stock, addon):
            counts = run.counts(name)
            failed = counts["failed"] + counts["not run"]
            row += [str(counts["passed"]), str(failed), str(counts["skipped"])]
        label = "**total**" if name is None else name.removeprefix("tests/")
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def render(version: str, files: list[str], stock: Run, addon: Run,
           comparison: Comparison) -> str:
    times = ", ".join(f"{run.name} {run.seconds:.0f} s" if run.seconds else
                      f"{run.name} not run this time (its last record)" for run in (stock, addon))
    lines = [f"# Scrapy {version}'s crawling tests: stock and with the MeteorSeed add-on", "",
             f"Run time: {times}.", "",
             *table(files, stock, addon), ""]
    hung = [outcome for outcome in addon.outcomes.values() if outcome.timeout]
    lines += [f"Hung with the add-on (stopped by the timeout): {len(hung)}"
              + "".join(f"\n- `{outcome.nodeid}`" for outcome in hung), ""]
    lines += _section(f"## Not in differences.txt: {len(comparison.unexpected)} (these fail "
                      "the run)", [_entry(outcome) for outcome in comparison.unexpected])
    if comparison.flaky:
        lines += _section(f"## Failed, then passed when run once more: {len(comparison.flaky)} "
                          "(these do not fail the run)", map(_entry, comparison.flaky))
    by_reason: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for outcome, difference in comparison.known:
        by_reason[(difference.reason, difference.kind)].append(outcome)
    lines += [f"## Known differences: {len(comparison.known)}", ""]
    for (reason, kind), outcomes in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        lines += _section(f"### {reason} ({kind}): {len(outcomes)}", map(_entry, outcomes))
    if comparison.now_pass:
        lines += _section(f"## Now passes, remove from differences.txt: "
                          f"{len(comparison.now_pass)}",
                          [f"- `{d.nodeid}` ({d.reason})" for d in comparison.now_pass])
    if comparison.absent:
        lines += _section(f"## Listed but not run: {len(comparison.absent)}",
                          [f"- `{d.nodeid}`" for d in comparison.absent])
    if comparison.stock_failures:
        lines += _section(f"## Failing on stock Scrapy too: {len(comparison.stock_failures)}",
                          map(_entry, comparison.stock_failures))
    return "\n".join(lines)

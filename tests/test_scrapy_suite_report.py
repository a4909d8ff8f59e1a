"""scrapy_suite's comparison of the two runs: what fails `make test-scrapy-suite` and what not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from meteorseed_scrapy.testing.parent_death import ended
from meteorseed_scrapy.testing.polling import wait_for
from scrapy_suite import run as suite
from scrapy_suite.plugin import SessionRedis
from scrapy_suite.report import compare, render
from scrapy_suite.results import Difference, Outcome, Run, load_differences


def _run(name: str, **outcomes: str) -> Run:
    run = Run(name)
    for nodeid, outcome in outcomes.items():
        run.outcomes[nodeid] = Outcome(nodeid, outcome, message=f"{nodeid} {outcome}")
    return run


def test_a_file_two_patterns_match_is_run_once(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    for name in ("test_a.py", "test_ab.py", "test_b.py"):
        (tmp_path / "tests" / name).write_text("")
    assert suite.test_files(tmp_path, ("test_a.py", "test_a*.py", "test_*.py")) == [
        "tests/test_a.py", "tests/test_ab.py", "tests/test_b.py"]
    with pytest.raises(SystemExit, match="test_c"):
        suite.test_files(tmp_path, ("test_c*.py",))


def test_every_listed_difference_is_of_a_file_the_suite_runs() -> None:
    files = tuple(pattern.removeprefix("tests/") for pattern in suite.FILES)
    for node in load_differences(suite.DIFFERENCES):
        name = node.split("::")[0].removeprefix("tests/")
        assert any(Path(name).match(pattern) for pattern in files), node


def test_only_an_unlisted_regression_fails_the_run() -> None:
    stock = _run("stock", a="passed", b="passed", c="passed", d="failed", e="skipped")
    addon = _run("addon", a="failed", b="failed", c="passed", d="failed", e="skipped")
    listed = {"b": Difference("b", "bug", "keyless items"), "c": Difference("c", "design", "x")}
    result = compare(stock, addon, listed)
    assert [outcome.nodeid for outcome in result.unexpected] == ["a"]
    assert [outcome.nodeid for outcome, _ in result.known] == ["b"]
    assert [difference.nodeid for difference in result.now_pass] == ["c"]
    assert [outcome.nodeid for outcome in result.stock_failures] == ["d"]
    text = render("2.19.0", ["a"], stock, addon, result)
    assert "Not in differences.txt: 1" in text
    assert "Now passes, remove from differences.txt: 1" in text


def test_a_failure_that_passed_when_run_once_more_is_reported_apart() -> None:
    stock = _run("stock", a="passed", b="passed")
    result = compare(stock, _run("addon", a="failed", b="failed"), {})
    result.flaky, result.unexpected = result.unexpected[:1], result.unexpected[1:]
    text = render("2.19.0", ["a", "b"], stock, _run("addon", a="failed", b="failed"), result)
    assert "Not in differences.txt: 1" in text
    assert "Failed, then passed when run once more: 1 (these do not fail the run)\n\n- `a`" \
        in text


def test_a_test_the_run_never_reached_counts_as_failed() -> None:
    stock = _run("stock", a="passed")
    result = compare(stock, _run("addon", a="not run"), {})
    assert [outcome.nodeid for outcome in result.unexpected] == ["a"]


def test_a_run_resumed_after_a_hang_is_read_as_one(tmp_path: Path) -> None:
    record = tmp_path / "addon.1.jsonl"
    lines = [{"collected": ["t::a", "t::b", "t::c"]},
             {"nodeid": "t::a", "outcome": "passed"},
             {"nodeid": "t::b", "outcome": "failed", "timeout": True, "message": "Timeout"},
             {"collected": ["t::c"]},
             {"nodeid": "t::c", "outcome": "skipped"}]
    record.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = Run.load("addon", [record])
    assert {nodeid: o.outcome for nodeid, o in run.outcomes.items()} == {
        "t::a": "passed", "t::b": "failed", "t::c": "skipped"}
    assert run.outcomes["t::b"].timeout and run.not_run() == []
    assert run.counts("t") == {"passed": 1, "failed": 1, "skipped": 1, "not run": 0}


@pytest.mark.parametrize("line", [
    "tests/x.py::test_a | bug",  # no reason
    "tests/x.py::test_a | maybe | a reason",  # neither design nor bug
    "tests/x.py::test_a | bug | ",  # an empty reason
])
def test_a_malformed_differences_line_is_refused_with_its_line_number(
        tmp_path: Path, line: str) -> None:
    path = tmp_path / "differences.txt"
    path.write_text(f"# comment\n\n{line}\n")
    with pytest.raises(ValueError, match=r"differences.txt:3: expected"):
        load_differences(path)


def test_the_repository_list_is_well_formed() -> None:
    listed = load_differences(Path(__file__).parent.parent / "scrapy_suite" / "differences.txt")
    assert listed and all(d.nodeid.startswith("tests/test_") for d in listed.values())


@pytest.mark.parametrize("ending", ["os._exit(1)", "os.kill(os.getpid(), signal.SIGKILL)"])
def test_the_session_redis_and_its_directories_go_when_their_owner_dies(
    tmp_path: Path, ending: str
) -> None:
    # What pytest-timeout's thread method does to a hung pytest: no unconfigure, no atexit.
    stores = tmp_path / "stores"
    stores.mkdir()
    script = ("import os, signal, sys\n"
              "from scrapy_suite.plugin import SessionRedis\n"
              f"redis = SessionRedis({str(stores)!r})\n"
              "print(redis.server.process.pid, redis.server.workdir, flush=True)\n"
              f"{ending}\n")
    owner = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=60, check=False)
    pid_text, workdir = owner.stdout.split()
    pid = int(pid_text)
    try:
        wait_for(lambda: ended(pid), timeout=30)
        wait_for(lambda: not Path(workdir).exists() and not stores.exists(), timeout=30)
    finally:
        if not ended(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_closed_session_redis_is_stopped_and_its_reaper_ends() -> None:
    redis = SessionRedis()
    assert redis.server.process is not None
    pid, reaper = redis.server.process.pid, redis._reaper
    redis.close()
    assert ended(pid)
    assert reaper.poll() is not None

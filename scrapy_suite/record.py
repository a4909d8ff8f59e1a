"""pytest plugin (``-p scrapy_suite.record``): each test's outcome, one JSON line as it ends.

Written as the run goes, so that a run that dies (pytest-timeout's thread method ends the
process on a hang) still says how far it got: the first line lists the collected tests, each
later line one test's outcome. The file is appended to: ``scrapy_suite.run`` resumes a run
after a hang with the tests left, into the same file.
"""

from __future__ import annotations

import json
from typing import IO, Any

import pytest

TIMEOUT_MARK = "Timeout"
PROBLEMS = ("WARNING", "ERROR", "CRITICAL")
PLAIN = ("DEBUG", "INFO", "{", "[", "'", "}", "]")
LINE_WIDTH = 300
MAX_PROBLEMS = 40


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--suite-record", help="file the outcome of each test is written to")


class _Recorder:
    """Registered as a plugin when ``--suite-record`` is given."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.current: dict[str, dict[str, Any]] = {}

    def write(self, line: dict[str, Any]) -> None:
        self.stream.write(json.dumps(line) + "\n")
        self.stream.flush()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.write({"collected": [item.nodeid for item in session.items]})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.current.setdefault(report.nodeid, {
            "nodeid": report.nodeid, "outcome": "passed", "duration": 0.0, "message": "",
        })
        entry["duration"] += report.duration
        if report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
            entry["message"] = _message(report)
        elif report.failed and entry["outcome"] != "failed":
            entry["outcome"] = "failed"
            entry["phase"] = report.when
            entry["message"] = _message(report)
            entry["detail"] = report.longreprtext
            entry["log"] = _problems(report.caplog)
            entry["timeout"] = TIMEOUT_MARK in entry["message"].split("\n", 1)[0]
        if report.when == "teardown":
            self.write(self.current.pop(report.nodeid))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.stream.close()


def _problems(log: str) -> list[str]:
    """The warnings and errors a failed test logged, each with the last line of its traceback:
    what says why, more often than the assertion does."""
    found: list[str] = []
    for line in log.splitlines():
        if line.startswith(PROBLEMS):
            found.append(line[:LINE_WIDTH])
        elif found and line and not line[0].isspace() and not line.startswith(PLAIN) \
                and line != "Traceback (most recent call last):":
            found[-1] += " -> " + line[:LINE_WIDTH]  # an exception's last line
    return found[:MAX_PROBLEMS]


def _message(report: pytest.TestReport) -> str:
    """The line that says why: the exception of the crash (pytest's ``E`` line)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (file, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    return str(longrepr).strip().splitlines()[-1] if longrepr else ""


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--suite-record")
    if path:
        stream = open(path, "a", encoding="utf-8")  # noqa: SIM115  (closed at unconfigure)
        config.pluginmanager.register(_Recorder(stream), "scrapy-suite-recorder")

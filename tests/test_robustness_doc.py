"""Every test docs/robustness.md names for a hostile case exists: a renamed or removed test
would leave a case stated as tested with nothing behind it."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "robustness.md"
TESTS = Path(__file__).resolve().parent
# `test_x.py::test_name`, `test_x.py` alone, or `::test_name` (of the file named before it)
NAMED = re.compile(r"`(test_[a-z0-9_]+\.py)(?:::(test_[a-z0-9_]+))?`|`::(test_[a-z0-9_]+)`")


def named_tests() -> list[tuple[str, str | None]]:
    named: list[tuple[str, str | None]] = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("|"):
            continue
        current = None
        for match in NAMED.finditer(line):
            file, test, same_file = match.groups()
            current = file or current
            if current is not None:
                named.append((current, test or same_file))
    return named


def test_the_tables_name_tests() -> None:
    assert len(named_tests()) > 50


def test_every_named_test_exists() -> None:
    missing = []
    for file, test in named_tests():
        path = TESTS / file
        if not path.is_file():
            missing.append(file)
        elif test and not re.search(rf"^(async )?def {test}\(", path.read_text(), re.M):
            missing.append(f"{file}::{test}")
    assert not missing

"""One run's outcomes (the JSON lines ``scrapy_suite.record`` writes) and the list of known
differences, read into plain data."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

OUTCOMES = ("passed", "failed", "skipped")


@dataclass
class Outcome:
    nodeid: str
    outcome: str  # passed, failed, skipped, or "not run" when the run died before it
    message: str = ""
    duration: float = 0.0
    timeout: bool = False
    detail: str = ""
    log: list[str] = field(default_factory=list)

    @property
    def cause(self) -> str:
        """The first error the test logged that names an exception or comes from the add-on
        (what usually says why, where the assertion only says what)."""
        for line in self.log:
            if " -> " in line or "meteorseed" in line:
                return " ".join(line.split()[2:])  # without the level and the logger's place
        return ""

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]


@dataclass
class Run:
    name: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    seconds: float = 0.0
    status: int = 0

    @classmethod
    def load(cls, name: str, paths: list[Path]) -> Run:
        """The records of one or more pytest runs (a run resumed after a hang adds to its
        file)."""
        run = cls(name)
        lines = [line for path in paths if path.exists()
                 for line in path.read_text(encoding="utf-8").splitlines()]
        for line in lines:
            data = json.loads(line)
            if "collected" in data:
                for nodeid in data["collected"]:
                    run.outcomes.setdefault(nodeid, Outcome(nodeid, "not run"))
            else:
                run.outcomes[data["nodeid"]] = Outcome(
                    data["nodeid"], data["outcome"], data.get("message", ""),
                    data.get("duration", 0.0), bool(data.get("timeout")),
                    data.get("detail", ""), data.get("log", []))
        return run

    def not_run(self) -> list[str]:
        """Collected but without an outcome, in the order they were to run."""
        return [nodeid for nodeid, outcome in self.outcomes.items()
                if outcome.outcome == "not run"]

    def failed(self, nodeid: str) -> bool:
        found = self.outcomes.get(nodeid)
        return found is not None and found.outcome in ("failed", "not run")

    def passed(self, nodeid: str) -> bool:
        found = self.outcomes.get(nodeid)
        return found is not None and found.outcome == "passed"

    def counts(self, file: str | None = None) -> dict[str, int]:
        counts = dict.fromkeys((*OUTCOMES, "not run"), 0)
        for outcome in self.outcomes.values():
            if file is None or outcome.file == file:
                counts[outcome.outcome] += 1
        return counts


@dataclass
class Difference:
    nodeid: str
    kind: str  # "design" (a documented difference) or "bug" (to fix in the add-on)
    reason: str


KINDS = ("design", "bug")


def load_differences(path: Path) -> dict[str, Difference]:
    """``nodeid | design-or-bug | reason`` a line; ``#`` starts a comment."""
    found: dict[str, Difference] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split("|")]
        if len(parts) != 3 or parts[1] not in KINDS or not parts[2]:
            raise ValueError(f"{path}:{number}: expected 'nodeid | design or bug | reason', "
                             f"got {raw!r}")
        found[parts[0]] = Difference(*parts)
    return found

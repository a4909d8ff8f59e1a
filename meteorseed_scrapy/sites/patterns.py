"""The regular expressions of site rules (a field's or link rule's ``regex``, ``blacklist``),
matched with a time bound.

Rule files are written by people and pushed at runtime, and a pattern such as ``^(a|aa)+$``
backtracks exponentially on a page of a few dozen characters. Python's ``re`` has no bound and
holds the GIL while it backtracks, so the keep-alive thread cannot renew the worker's
heartbeat and the task is taken over by the next worker, which blocks too. The ``regex``
module keeps ``re``'s syntax (rule files with look-arounds and back-references still load,
which a linear-time engine such as RE2 would refuse), takes a ``timeout`` and, with
``concurrent=True``, releases the GIL while it matches. A match that runs out of time raises
:class:`PatternTimeout`: the field becomes an anomaly reason, the link rule finds no link on
that page.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import regex

#: Seconds one rule's pattern may spend on one page (all its values together).
MATCH_BUDGET = 0.25


class PatternTimeout(ValueError):
    """A rule's regular expression ran out of its time on a value."""

    def __init__(self, pattern: str, budget: float) -> None:
        shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
        super().__init__(f"regex {shown!r} timed out after {budget:g} s on this page"
                         " (catastrophic backtracking?)")
        self.pattern = pattern


class RulePattern:
    """A compiled rule pattern: :meth:`search` as ``re``'s, bounded in time."""

    __slots__ = ("_compiled", "budget", "pattern")

    def __init__(self, pattern: str, budget: float = MATCH_BUDGET) -> None:
        self._compiled = regex.compile(pattern)
        self.pattern = pattern
        self.budget = budget

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RulePattern) and (other.pattern, other.budget) == (
            self.pattern, self.budget)

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"RulePattern({self.pattern!r})"

    def search(self, text: str, deadline: float | None = None) -> Any:
        """The first match in ``text`` or None; :class:`PatternTimeout` past ``deadline`` (a
        :func:`time.monotonic` value; None: this call alone gets the whole budget)."""
        left = self.budget if deadline is None else deadline - time.monotonic()
        if left <= 0:
            raise PatternTimeout(self.pattern, self.budget)
        try:
            return self._compiled.search(text, timeout=left, concurrent=True)
        except TimeoutError:
            raise PatternTimeout(self.pattern, self.budget) from None

    def first_groups(self, values: Iterable[Any]) -> list[str]:
        """The first group (else the whole match) of each string of ``values`` that matches,
        all of them within one budget."""
        deadline = time.monotonic() + self.budget
        out = []
        for value in values:
            match = self.search(value, deadline) if isinstance(value, str) else None
            if match is not None:
                out.append(match.group(1) if match.groups() else match.group(0))
        return out


def compile_pattern(pattern: str) -> RulePattern:
    """``pattern`` compiled, or ``ValueError`` with the engine's reason."""
    try:
        return RulePattern(pattern)
    except regex.error as exc:
        raise ValueError(str(exc)) from None


__all__ = ["MATCH_BUDGET", "PatternTimeout", "RulePattern", "compile_pattern"]

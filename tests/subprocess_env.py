"""The ``PYTHONPATH`` of every Python subprocess the suite starts: ``tests/offline_python`` first,
whose ``sitecustomize`` resolves loopback names only, as the pytest processes do."""

from __future__ import annotations

import os
from pathlib import Path

OFFLINE_PYTHON = Path(__file__).resolve().parent / "offline_python"


def python_path(*dirs: str | Path) -> str:
    """``dirs`` (each a directory or a ``PYTHONPATH``) as one ``PYTHONPATH``, after the
    directory of the loopback-only guard, each directory once."""
    parts = [str(OFFLINE_PYTHON)]
    for entry in dirs:
        parts += [p for p in str(entry).split(os.pathsep) if p and p not in parts]
    return os.pathsep.join(parts)

"""Print pip constraints pinning every direct dependency of setup.cfg to its floor.

``python .ci/floors.py > floors.txt`` then ``pip install -e . -c floors.txt``: the package is
installed (and tested) with the oldest versions its metadata claims to support. Every
install_requires line must have a ``>=`` floor; a missing one is an error, not a silent skip.
Extras are dropped: pip constraints take a name and a version only. ``--extras`` pins the
floors of the optional extras too (``dev`` aside: test tools, not what a user installs), for
the whole suite at the floors (``make test-floors-all``).
"""

from __future__ import annotations

import configparser
import sys
from pathlib import Path

from packaging.requirements import Requirement


def floors(setup_cfg: Path, extras: bool = False) -> list[str]:
    config = configparser.ConfigParser()
    config.read(setup_cfg, encoding="utf-8")
    lines = config["options"]["install_requires"].splitlines()
    if extras:
        for name, value in config["options.extras_require"].items():
            if name != "dev":
                lines.extend(value.splitlines())
    pins: list[str] = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if len(lower) != 1:
            raise SystemExit(f"{setup_cfg}: {line!r} needs exactly one '>=' floor")
        pin = f"{requirement.name}=={lower[0]}"
        if pin not in pins:
            pins.append(pin)
    return pins


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    pins = floors(root / "setup.cfg", extras="--extras" in sys.argv[1:])
    sys.stdout.write("".join(f"{pin}\n" for pin in pins))

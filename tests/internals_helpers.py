"""What the tests of the ``*_internals`` modules share: the installed release of a dependency is
within the range its private parts were checked on, whose floor is setup.cfg's; no module but
the door reaches into the dependency's privates; whether this Scrapy crawls without a reactor."""

from __future__ import annotations

import configparser
import importlib.metadata
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.version import Version
from scrapy.settings import default_settings

SETUP_CFG = Path(__file__).parent.parent / "setup.cfg"
#: Whether this Scrapy has a reactorless mode (``TWISTED_REACTOR_ENABLED``; not 2.14, setup.cfg's
#: floor, which builds a crawler only once a reactor is installed: conftest installs one then).
REACTORLESS = hasattr(default_settings, "TWISTED_REACTOR_ENABLED")


def assert_in_checked_range(name: str, checked: tuple[str, str], listed_in: str) -> None:
    """``name``'s installed release is not older than ``checked``'s floor nor of a minor
    release newer than its newest (then ``listed_in``'s list wants reading again)."""
    floor, newest = (Version(v) for v in checked)
    installed = Version(importlib.metadata.version(name))
    assert floor <= installed, f"{name} {installed} is older than the checked floor {floor}"
    assert Version(f"{installed.major}.{installed.minor}") <= newest, (
        f"{name} {installed} is newer than the newest release checked ({newest}): read "
        f"{listed_in}'s list against its source, then raise its checked range")


def setup_cfg_floor(requirement_name: str) -> Version:
    """The ``>=`` floor of ``requirement_name`` in setup.cfg's install_requires."""
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    requirement = next(line for line in config["options"]["install_requires"].splitlines()
                       if line.strip().startswith(requirement_name))
    floor = re.search(r">=\s*([\d.]+)", requirement)
    assert floor is not None
    return Version(floor.group(1))


def offenders(package: Path, private: re.Pattern[str], door: str, *, mentioning: str = "",
              more: Callable[[str], Iterable[int]] = lambda text: ()) -> list[str]:
    """The lines of ``package``'s modules (but ``door``; only those mentioning ``mentioning``)
    whose code (comments aside) matches ``private``, or that ``more(module's text)`` names."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        if path.name == door or mentioning not in text:
            continue
        lines = text.splitlines()
        numbers = {number for number, line in enumerate(lines, 1)
                   if private.search(line.split("#", 1)[0])}
        numbers.update(more(text))
        found += [f"{path.relative_to(package.parent)}:{n}: {lines[n - 1].strip()}"
                  for n in sorted(numbers)]
    return found


def flagged(scan: Callable[[Path], list[str]], tmp_path: Path, text: str) -> list[int]:
    """The line numbers of ``text``, a module of a package of its own, that ``scan`` flags."""
    package = tmp_path / "package"
    package.mkdir()
    (package / "module.py").write_text(text)
    return [int(line.split(":", 2)[1]) for line in scan(package)]

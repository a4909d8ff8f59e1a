"""The README's install path for another project, tried on a fresh venv: ``make dist`` builds
a wheel (``pip wheel``), which installs with ``pip install --no-deps`` into a new venv that sees
the already-installed dependencies through a ``.pth`` file (nothing is downloaded: the wheel is
built with this venv's setuptools, without build isolation, which would fetch one from the
index), and then works there: console script, Scrapy command, Lua scripts and console files
inside the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_into_a_fresh_venv_and_works(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(["make", "-s", "dist", f"DIST={dist}", f"PY={sys.executable}",
                    "DIST_FLAGS=--no-build-isolation"],
                   cwd=REPO, check=True, capture_output=True, timeout=180)
    [wheel] = dist.glob("meteorseed_scrapy-*.whl")

    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(target)
    python = target / "bin" / "python"
    # (without PYTHONPATH: a checkout on it, with the egg-info the build left there, would look
    # installed to pip, which would then skip the wheel)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "--no-deps", "--disable-pip-version-check", str(wheel)], check=True,
                   capture_output=True, timeout=120, env=clean)
    # The dependencies this test runs with, after the venv's own site-packages (a .pth line
    # is appended to sys.path; its .pth files, among them the checkout's editable install,
    # are not read).
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], check=True, capture_output=True,
                               text=True).stdout.strip())
    (site / "_meteorseed_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {"PATH": f"{target / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    check = (
        "import importlib.metadata as m, meteorseed_scrapy, pathlib;"
        "from meteorseed_scrapy.queue.plumbing.scripts import script_source;"
        "from importlib import resources;"
        "print(pathlib.Path(meteorseed_scrapy.__file__).parent);"
        "print(m.distribution('meteorseed-scrapy').version);"
        "assert 'dd_add' in script_source('enqueue');"
        "assert resources.files('meteorseed_scrapy').joinpath('console/static/index.html')"
        ".is_file()")
    out = subprocess.run([str(python), "-c", check], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout.splitlines()
    assert out[0] == str(site / "meteorseed_scrapy")  # the wheel's copy, not the checkout
    help_text = subprocess.run([str(target / "bin" / "meteorseed"), "--help"], cwd=tmp_path,
                               env=env, check=True, capture_output=True, text=True,
                               timeout=120).stdout
    assert "task" in help_text and "redis" in help_text
    commands = subprocess.run([str(python), "-m", "scrapy", "-h"], cwd=tmp_path, env=env,
                              check=True, capture_output=True, text=True, timeout=120).stdout
    assert "seed-expand" in commands
    assert not os.path.exists(tmp_path / "meteorseed_scrapy")

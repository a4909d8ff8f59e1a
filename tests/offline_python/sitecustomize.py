"""Imported by every Python the suite starts (``tests.subprocess_env.python_path`` puts this
directory first on its ``PYTHONPATH``): no name lookup of a worker, a ``scrapy`` command or pip
leaves the machine, as in the pytest processes (``meteorseed_scrapy.testing.loopback_dns``).

The guard is loaded from its file rather than imported: the subprocess may import another copy
of ``meteorseed_scrapy`` (an installed wheel) or none at all (pip)."""

import importlib.util
import sys
from pathlib import Path

_NAME = "_meteorseed_loopback_dns"
_FILE = Path(__file__).resolve().parents[2] / "meteorseed_scrapy" / "testing" / "loopback_dns.py"
_spec = importlib.util.spec_from_file_location(_NAME, _FILE)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _module
    _spec.loader.exec_module(_module)
    _module.resolve_loopback_only()

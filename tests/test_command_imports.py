"""`seed-expand` costs every `scrapy` command nothing noticeable to import.

Scrapy imports every ``scrapy.commands`` entry point on each run, even for ``scrapy list``, so
the command module may import Scrapy's command base and nothing heavy (no redis, asyncio,
aiohttp, the HTTP API or the seeding machinery) until ``run()``. Measured with
``python -X importtime`` in a child process, after ``scrapy.cmdline`` (which every command pays
anyway): the module count is exact, and the time is compared with Scrapy's own import time in
the same process, never against a wall-clock number a busy machine would break.
"""

from __future__ import annotations

import re
import subprocess
import sys

COMMAND = "meteorseed_scrapy.commands.seed_expand"
HEAVY = ("redis", "asyncio", "aiohttp", "yaml", "meteorseed_scrapy.api",
         "meteorseed_scrapy.seeding", "meteorseed_scrapy.queue", "meteorseed_scrapy.migrate",
         "meteorseed_scrapy.sites")
LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def _import_profile() -> tuple[int, int, list[str]]:
    """Scrapy's cumulative µs, the command's cumulative µs, and the modules the command added."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import scrapy.cmdline; import {COMMAND}"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    rows = [match.groups() for line in done.stderr.splitlines() if (match := LINE.match(line))]
    names = [name for _, _, _, name in rows]
    cumulative = {name: int(total) for _, total, _, name in rows}
    # importtime prints a module after its children: the command's own imports sit between
    # scrapy.cmdline's line and its own.
    added = names[names.index("scrapy.cmdline") + 1:names.index(COMMAND) + 1]
    return cumulative["scrapy.cmdline"], cumulative[COMMAND], added


def test_the_command_imports_nothing_heavy() -> None:
    _, _, added = _import_profile()
    heavy = [name for name in added if any(name == h or name.startswith(h + ".") for h in HEAVY)]
    assert heavy == []
    # meteorseed_scrapy, .commands and the command itself: nothing else.
    assert len(added) <= 5, added


def test_the_command_costs_a_small_share_of_scrapys_own_import() -> None:
    # Under 100 ms is the goal; Scrapy's own import is some 250 ms here, and the command took
    # about half of that before it imported lazily. The best of a few rounds: a busy machine
    # slows both sides of the ratio, rarely just one of them every time.
    shares = []
    for _ in range(3):
        scrapy_us, command_us, _ = _import_profile()
        shares.append(command_us / scrapy_us)
    assert min(shares) < 0.1, shares


def test_listing_the_rule_spider_does_not_load_the_browser() -> None:
    # `scrapy list` in a project with the rule spider imports sites.spider and, through it,
    # sites.render: scrapy-playwright and Playwright (~160 ms) load only with the handler.
    code = ("import sys, meteorseed_scrapy.sites.spider, meteorseed_scrapy.sites.render; "
            "print(sorted(m for m in ('scrapy_playwright', 'playwright') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stderr

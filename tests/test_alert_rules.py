"""The shipped Prometheus alert rules (deploy/prometheus/): valid, unit-tested by promtool on
series that should and should not raise each alert, and naming only metrics a worker exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.observability.metrics import MetricsExtension

RULES = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")


@needs_promtool
@pytest.mark.parametrize("check", [["check", "rules", "meteorseed-alerts.yml"],
                                   ["test", "rules", "meteorseed-alerts.test.yml"]],
                         ids=["check", "unit-tests"])
def test_promtool_accepts_the_rules_and_their_unit_tests(check: list[str]) -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *check], cwd=RULES, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_metric_the_rules_name_is_exposed_by_a_worker() -> None:
    crawler = get_crawler(settings_dict={"METEORSEED_METRICS_PORT": 9})  # not served
    ext = MetricsExtension.from_crawler(crawler)
    ext.sites.breaker("news", "open")
    text = generate_latest(ext.registry).decode()
    exposed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            exposed |= {name, f"{name}_total"} if kind == "counter" else {name}
    rules = (RULES / "meteorseed-alerts.yml").read_text()
    named = set(re.findall(r"\bmeteorseed_[a-z_]+", rules))
    assert named and named <= exposed, sorted(named - exposed)

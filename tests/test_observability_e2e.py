"""Real `scrapy crawl` workers: JSON log lines with task ids, the Prometheus endpoint."""

from __future__ import annotations

import io
import json
import os
import re
import urllib.request
from pathlib import Path

import pytest

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.redis_server import free_port
from meteorseed_scrapy.testing.sites import DemoSite
from tests.e2e_helpers import Worker, enqueue, start_worker

pytestmark = pytest.mark.e2e


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on (Linux: its socket inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        for line in path.read_text().splitlines()[1:] if path.exists() else []:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def opened(worker: Worker) -> bool:
    return "Spider opened" in worker.log()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def sample(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name + (f"{{{wanted}}}" if labels else "")) + r" (\S+)"
    match = re.search(rf"^{pattern}$", text, re.M)
    return float(match.group(1)) if match else None


def test_json_log_lines_carry_the_task_ids(
    tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite
) -> None:
    pages = enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/{i}" for i in (1, 2, 3)],
                    seed_id="seed-ok")
    [broken] = enqueue(redis_url, namespace, [f"{demo_site.url}/status/500"], seed_id="seed-bad")
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_LOG_JSON=1, LOG_LEVEL="DEBUG",
                          METEORSEED_IDLE_CLOSE=3)
    wait_for(lambda: opened(worker), timeout=60)
    # No metrics endpoint unless a port is set (Scrapy's remote control may listen, though).
    for port in listening_ports(worker.proc.pid):
        with pytest.raises(OSError):
            scrape(port)
    assert worker.wait() == 0, worker.log()[-3000:]

    log = worker.log()
    assert "MetricsExtension" not in log.split("Enabled extensions", 1)[1].split("]", 1)[0]
    # Scrapy's start-up banner is written before any project code runs: plain text.
    lines = [json.loads(line) for line in log[log.index("\n{\"") + 1:].splitlines()]
    assert lines and all({"time", "level", "logger", "message"} <= set(d) for d in lines)
    for task in pages:
        about = [d for d in lines if task.url in d["message"]]
        assert about, task.url
        for doc in about:
            assert (doc.get("task_id"), doc.get("seed_id")) == (task.task_id, "seed-ok"), doc
    dead = [d for d in lines if d["message"].startswith("Dead-lettered")]
    assert [(d["task_id"], d["seed_id"]) for d in dead] == [(broken.task_id, "seed-bad")]
    # The id the line gives is the one `meteorseed dead show` takes.
    letter = re.search(r"as dead letter (\S+) ", dead[0]["message"])
    assert letter, dead[0]["message"]
    out = io.StringIO()
    assert main(["dead", "show", "--redis-url", redis_url, "--namespace", namespace,
                 letter.group(1), "--json"], stdout=out, stderr=io.StringIO()) == 0
    assert json.loads(out.getvalue())["task_id"] == broken.task_id
    unrelated = [d for d in lines if d["message"].startswith("Spider opened")]
    assert unrelated and "task_id" not in unrelated[0]


def test_metrics_endpoint_shows_queue_outcomes_and_latency(
    tmp_path: Path, redis_url: str, namespace: str, demo_site: DemoSite
) -> None:
    urls = [f"{demo_site.url}/news/article/{i}" for i in range(1, 21)]
    enqueue(redis_url, namespace, [*urls, f"{demo_site.url}/status/404"])
    port = free_port()
    worker = start_worker(tmp_path, redis_url, namespace, METEORSEED_METRICS_PORT=port,
                          METEORSEED_METRICS_INTERVAL=0.2, METEORSEED_IDLE_CLOSE=4)
    try:
        wait_for(lambda: port in listening_ports(worker.proc.pid), timeout=60)

        def finished() -> str | None:
            text = scrape(port)
            done = sample(text, "meteorseed_tasks_total", outcome="done")
            # (the queue's gauges are sampled every 0.2 s apart from the counters: wait for a
            # sample taken after the last ack too)
            drained = all(sample(text, "meteorseed_lane_pending", lane=lane) == 0
                          for lane in ("realtime", "scheduled", "retry"))
            return text if (done == 20 and sample(text, "meteorseed_queue_backlog") == 0
                            and drained) else None

        text = wait_for(finished, timeout=60, interval=0.2)
    finally:
        assert worker.wait() == 0, worker.log()[-3000:]
    assert sample(text, "meteorseed_tasks_total", outcome="gone") == 1
    assert sample(text, "meteorseed_tasks_total", outcome="dead") == 0
    assert sample(text, "meteorseed_ingest_latency_seconds_count") == 21
    assert sample(text, "meteorseed_queue_lag_seconds") == 0
    for name in ("meteorseed_queue_pending", "meteorseed_queue_length",
                 "meteorseed_acked_total", "meteorseed_site_breaker_state"):
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    assert re.search(r'^meteorseed_consumer_pending\{consumer="w1"\} \d', text, re.M), text
    for lane in ("realtime", "scheduled", "retry"):  # every lane, drained
        assert sample(text, "meteorseed_lane_backlog", lane=lane) == 0, lane
        assert sample(text, "meteorseed_lane_pending", lane=lane) == 0, lane
    assert sample(text, "meteorseed_spider_backlog", spider="") == 0  # (names no spider)
    log = worker.log()
    assert f"Prometheus metrics on http://127.0.0.1:{port}/metrics" in log
    assert "Traceback" not in log and "Error caught on signal handler" not in log, log[-3000:]

"""Pause and cancel a seed on a fleet of four workers (issue 24.4): no request of it reaches the
site later than the promised bound after the command, the other seed of the same site goes on,
nothing is lost on pause, and a cancelled seed ends ``finished`` with every task counted. The
figures (time from the command to the last request at the site) are printed;
benchmarks/seed_pause.py prints them over rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.seed_control_rig import BOUND_S, cancel_round, pause_round


@pytest.mark.e2e
def test_a_paused_seed_gets_no_request_after_the_bound_and_resumes_losing_nothing(
        tmp_path: Path, redis_url: str, namespace: str) -> None:
    got = pause_round(tmp_path, redis_url, namespace)
    assert got.after_bound == 0, got  # (none later than BOUND_S after the hold exists)
    assert got.stored < got.total  # held tasks waited for the resume
    assert got.other_while > 0  # the other seed of the same site went on
    print(f"seed pause -> last request at the site: {got.last_request_s:.2f} s after the "
          f"command ({got.requests_after} request(s) after it, command {got.command_s:.2f} s,"
          f" bound {BOUND_S} s, 4 workers x 8)")


@pytest.mark.e2e
def test_a_cancelled_seed_is_finished_with_every_task_counted(
        tmp_path: Path, redis_url: str, namespace: str) -> None:
    got = cancel_round(tmp_path, redis_url, namespace)
    assert got.after_bound == 0, got
    progress = got.progress
    assert progress is not None and progress["state"] == "finished"
    assert progress["cancelled"] > 0 and progress["dead"] == 0
    assert progress["done"] + progress["cancelled"] == progress["enqueued"] == 150
    stored_target = got.stored - 150  # (every task of the other seed is stored)
    assert stored_target == progress["done"]
    print(f"seed cancel -> last request at the site: {got.last_request_s:.2f} s; "
          f"{progress['cancelled']} cancelled, {progress['done']} done")

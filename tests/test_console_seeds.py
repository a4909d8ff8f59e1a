"""Seeds expanded by ``scrapy seed-expand`` are in the seed registry, so the console's Seeds table
(``GET /seeds``) lists them with the run's counts; ``--no-register`` leaves them out. The counts
per seed are exact whatever the batch size cuts (a property test on real Redis)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.commands.expand_file import ExpandedSeeds
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.seeding.expand import expand_lines
from meteorseed_scrapy.seeding.expand_types import ExpandOptions
from meteorseed_scrapy.seeding.registry import SeedRegistry
from tests.api_helpers import ApiServer, Client
from tests.test_seed_expand import run_cli, seed_line, summary_of


def _seeds(api_server: ApiServer) -> dict[str, dict[str, Any]]:
    with api_server() as server:
        status, _, body = Client(server.url).call("GET", "/seeds")
    assert status == 200, body
    return {row["seed_id"]: row for row in body["seeds"]}


def test_seed_expand_registers_its_seeds_with_the_runs_counts(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        api_server: ApiServer) -> None:
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join([
        seed_line(["https://a.example/1", "https://a.example/2"], seed_id="s1"),
        "not json at all",
        seed_line(["https://a.example/2", "mailto:x@a.example", "https://a.example/3"],
                  seed_id="s2"),
        json.dumps({"seed_id": "s3<b>", "site_id": "news", "task_type": "url_list",
                    "payload": {"urls": ["https://a.example/4"]}}),
        seed_line(["https://a.example/5"], seed_id=""),
    ]) + "\n")
    settings = {"METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace}
    proc = run_cli([seeds.name], tmp_path, settings=settings)
    # lines, enqueued, duplicates, rejected
    assert summary_of(proc.stdout) == (5, 4, 1, 3), proc.stderr
    rows = _seeds(api_server)
    assert set(rows) == {"s1", "s2", "s3<b>"}  # a bad line (bad JSON, no seed_id) is no seed
    s1, s2 = rows["s1"], rows["s2"]
    assert (s1["last_enqueued"], s1["last_duplicates"], s1["last_rejected"]) == (2, 0, 0)
    assert (s2["last_enqueued"], s2["last_duplicates"], s2["last_rejected"]) == (1, 1, 1)
    assert s1["runs"] == 1 and s1["last_error"] is None and s1["status"] == "ok"
    # One-shot seeds: not scheduled again, not left leased to this (finished) run.
    assert s1["next_due"] is None and s2["next_due"] is None
    assert sync_redis.zcard(KeyLayout(namespace).seeds_due) == 0

    again = run_cli([seeds.name], tmp_path, settings=settings)  # the same file once more
    assert summary_of(again.stdout) == (5, 0, 5, 3), again.stderr
    s1 = _seeds(api_server)["s1"]
    assert (s1["runs"], s1["last_enqueued"], s1["last_duplicates"]) == (2, 0, 2)


def test_no_register_leaves_the_registry_alone(tmp_path: Path, redis_url: str,
                                               namespace: str, api_server: ApiServer) -> None:
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text(seed_line(["https://a.example/1"], seed_id="quiet") + "\n")
    settings = {"METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace}
    proc = run_cli([seeds.name, "--no-register"], tmp_path, settings=settings)
    assert summary_of(proc.stdout) == (1, 1, 0, 0), proc.stderr
    assert _seeds(api_server) == {}


async def _expand(redis_url: str, namespace: str, lines: list[str], batch: int
                  ) -> tuple[dict[str, tuple[int, int, int]], Any]:
    client = async_client(redis_url, decode_responses=True)
    keys = KeyLayout(namespace)
    try:
        seeds = ExpandedSeeds(SeedRegistry(client, keys))
        summary = await expand_lines(lines, TaskWriter(client, keys),
                                     ExpandOptions(batch_size=batch),
                                     on_error=lambda rejection: None, watcher=seeds)
        await seeds.finish()
        records = await SeedRegistry(client, keys).list(limit=1000)
        return {r.seed.seed_id: (r.last_enqueued or 0, r.last_duplicates or 0,
                                 r.last_rejected or 0) for r in records}, summary
    finally:
        await client.aclose()


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=6), min_size=1,
                     max_size=6),
       batch=st.integers(1, 7), salt=st.uuids())
def test_per_seed_counts_are_exact_whatever_the_batches(
        redis_url: str, plan: list[list[int]], batch: int, salt: Any) -> None:
    """Seed k lists URLs by number (0-5, shared between seeds: duplicates) and a bad one when
    the number is 5; its counts are what a seed-at-a-time expansion would give."""
    namespace = f"p{salt.hex[:12]}"
    lines, expected, seen = [], {}, set()
    for k, numbers in enumerate(plan):
        urls = [f"https://p.example/{n}" if n < 5 else "ftp://p.example/bad" for n in numbers]
        lines.append(seed_line(urls, seed_id=f"seed{k}"))
        enq = dup = bad = 0
        for n in numbers:
            if n == 5:
                bad += 1
            elif n in seen:
                dup += 1
            else:
                seen.add(n)
                enq += 1
        expected[f"seed{k}"] = (enq, dup, bad)
    try:
        got, summary = asyncio.run(_expand(redis_url, namespace, lines, batch))
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    assert got == expected
    assert sum(v[0] for v in got.values()) == summary.enqueued

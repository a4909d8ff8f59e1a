"""``scrapy seed-expand --from-scrapy-redis SPIDER``, run as a real subprocess."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis
from scrapy import Request, Spider
from scrapy_redis.queue import PriorityQueue

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.subprocess_env import python_path

REPO = Path(__file__).resolve().parents[1]
SCRAPY = Path(sys.executable).with_name("scrapy")


def seed_expand(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=python_path(REPO))
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    env.pop("REDIS_URL", None)
    return subprocess.run([str(SCRAPY), "seed-expand", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def fill(redis_url: str, spider_name: str) -> redis.Redis:
    client = redis.Redis.from_url(redis_url)
    spider = Spider(name=spider_name)
    queue = PriorityQueue(client, spider, "%(spider)s:requests")
    for i in range(5):
        queue.push(Request(f"https://cli.example/{i}", priority=i, meta={"n": i}))
    client.rpush(f"{spider_name}:start_urls", "https://cli.example/start")
    return client


def test_move_with_scrapy_redis_settings(tmp_path: Path, redis_url: str, namespace: str,
                                         sync_redis: redis.Redis) -> None:
    client = fill(redis_url, namespace)
    # No METEORSEED_REDIS_URL: the project's scrapy-redis REDIS_URL is used.
    proc = seed_expand(tmp_path, "--from-scrapy-redis", namespace, "--move",
                       "--site-id", "cli", "-s", f"REDIS_URL={redis_url}",
                       "-s", f"METEORSEED_NAMESPACE={namespace}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "read 6 entries (5 requests, 1 start URLs), enqueued 6, duplicates 0, rejected 0, "
        "removed 6 from scrapy-redis")
    assert not client.exists(f"{namespace}:requests", f"{namespace}:start_urls")
    # Every stream, in the order workers prefer them (priority bands first): the spider's own
    # (the spider of these tests is named as the namespace), for its workers only.
    keys = KeyLayout(namespace).with_spiders([namespace])
    entries: Any = [e for s in keys.streams for e in sync_redis.xrange(s)]
    tasks = [ExecTask.from_message(fields) for _, fields in entries]
    assert [t.url for t in tasks][:5] == [f"https://cli.example/{i}" for i in (4, 3, 2, 1, 0)]
    assert {t.site_id for t in tasks} == {"cli"} and {t.seed_id for t in tasks} == {"scrapy-redis"}
    assert {t.spider for t in tasks} == {namespace}
    client.close()


def test_rejections_exit_non_zero(tmp_path: Path, redis_url: str, namespace: str) -> None:
    client = fill(redis_url, namespace)
    client.zadd(f"{namespace}:requests", {pickle.dumps({"url": "https://cli.example/x",
                                                        "_class": "myproj.SplashRequest"}): 0})
    proc = seed_expand(tmp_path, "--from-scrapy-redis", namespace, "--dry-run",
                       "-s", f"METEORSEED_REDIS_URL={redis_url}",
                       "-s", f"METEORSEED_NAMESPACE={namespace}")
    assert proc.returncode == 1
    assert f"{namespace}:requests entry 4: _class: 'myproj.SplashRequest'" in proc.stderr
    assert proc.stdout.strip().endswith(
        "dry run: read 7 entries (6 requests, 1 start URLs), would enqueue up to 6, rejected 1")
    assert not client.exists(KeyLayout(namespace).stream)
    client.close()


def test_usage_errors(tmp_path: Path) -> None:
    proc = seed_expand(tmp_path, "--move", "seeds.jsonl")
    assert proc.returncode != 0 and "--move needs --from-scrapy-redis" in proc.stderr
    proc = seed_expand(tmp_path, "--from-scrapy-redis", "s", "--move", "--dry-run")
    assert proc.returncode != 0 and "exclude each other" in proc.stderr


def test_a_hostile_entry_is_skipped_reported_and_left(tmp_path: Path, redis_url: str,
                                                      namespace: str) -> None:
    client = fill(redis_url, namespace)
    bad = b"cos\x1b[2J\nsystem\n(S'touch pwned'\ntR."  # a global whose name clears the screen
    client.zadd(f"{namespace}:requests", {bad: -10})  # the lowest score: served first
    proc = seed_expand(tmp_path, "--from-scrapy-redis", namespace, "--move",
                       "-s", f"METEORSEED_REDIS_URL={redis_url}",
                       "-s", f"METEORSEED_NAMESPACE={namespace}")
    assert proc.returncode == 1, proc.stderr
    assert "\x1b" not in proc.stderr + proc.stdout
    assert f"{namespace}:requests entry 0: pickle refers to 'os\\x1b[2J.system'" in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "read 7 entries (6 requests, 1 start URLs), enqueued 6, duplicates 0, rejected 1, "
        "removed 6 from scrapy-redis")
    assert client.zrange(f"{namespace}:requests", 0, -1) == [bad]
    assert not (tmp_path / "pwned").exists()
    client.close()


def test_dry_run_of_a_seed_file_is_not_taken_for_the_migration_s(
        tmp_path: Path, redis_url: str, namespace: str) -> None:
    """One ``--dry-run`` for both modes (issue 22: the migration's option of the same name
    shadowed seed-expand's and refused it without --from-scrapy-redis)."""
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text('{"seed_id": "s1", "site_id": "x", "task_type": "url_list",'
                     ' "payload": {"urls": ["https://a.example/1", "https://a.example/2"]}}\n')
    proc = seed_expand(tmp_path, "--dry-run", str(seeds),
                       "-s", f"METEORSEED_REDIS_URL={redis_url}",
                       "-s", f"METEORSEED_NAMESPACE={namespace}")
    assert proc.returncode == 0, proc.stderr
    assert "would enqueue up to 2 (dry run" in proc.stdout
    client = redis.Redis.from_url(redis_url)
    assert not client.exists(KeyLayout(namespace).stream)
    client.close()
    usage = " ".join(seed_expand(tmp_path, "--help").stdout.split())
    assert usage.count("--dry-run") == 1 and "with --from-scrapy-redis: count what" in usage

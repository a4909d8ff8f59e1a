"""The ``meteorseed`` console script against a real Redis: status, dead letters, reset."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.queue.enqueue.dedup import fingerprint_bytes
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.redis_server import free_port


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(redis_url: str, namespace: str, *argv: str, stdin: io.StringIO | None = None
        ) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv[:2], "--redis-url", redis_url, "--namespace", namespace, *argv[2:]]
                if argv[0] == "dead" else
                [argv[0], "--redis-url", redis_url, "--namespace", namespace, *argv[1:]],
                stdin=stdin or io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def run_json(redis_url: str, namespace: str, *argv: str) -> Any:
    code, out, err = run(redis_url, namespace, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def add_tasks(r: redis.Redis, keys: KeyLayout, n: int, site: str = "news") -> list[ExecTask]:
    tasks = [ExecTask.create(seed_id="s1", site_id=site, url=f"https://{site}.test/{i}")
             for i in range(n)]
    for task in tasks:
        r.xadd(keys.stream, task.to_message())
        r.sadd(keys.seen(site), fingerprint_bytes(task).hex())
    return tasks


def add_dead(r: redis.Redis, keys: KeyLayout, payload: str, reason: str = "HTTP 500") -> str:
    return str(r.xadd(keys.dead, {"t": payload, "reason": reason, "source_id": "1-1",
                                  "consumer": "w1", "deliveries": "5", "at": "1700000000.5"}))


def test_status_counts_waiting_pending_dead_and_consumers(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    add_tasks(sync_redis, keys, 7)
    sync_redis.xgroup_create(keys.stream, GROUP, id="0")
    sync_redis.xreadgroup(GROUP, "w1", {keys.stream: ">"}, count=2)
    sync_redis.xreadgroup(GROUP, "w2", {keys.stream: ">"}, count=1)
    add_dead(sync_redis, keys, "{}")
    add_dead(sync_redis, keys, "{}")

    status = run_json(redis_url, namespace, "status")

    assert (status["backlog"], status["pending"], status["stream_length"], status["dead"]) == (
        4, 3, 7, 2)
    consumers = {c["name"]: c for c in status["consumers"]}
    assert {n: c["pending"] for n, c in consumers.items()} == {"w1": 2, "w2": 1}
    assert all(isinstance(c["idle_ms"], int) for c in consumers.values())
    assert status["seen"] == {"news": 7}
    assert status["redis"]["version"] == sync_redis.info("server")["redis_version"]
    # The test server runs without AOF: status must flag it.
    assert status["redis"]["appendonly"] == "no" and status["redis"]["warning"] is True

    code, table, _ = run(redis_url, namespace, "status")
    assert code == 0
    assert "backlog" in table and " 4 " in table and "w1" in table and "WARNING" in table


def test_status_of_an_empty_namespace(redis_url: str, namespace: str) -> None:
    status = run_json(redis_url, namespace, "status")
    assert status["backlog"] == status["pending"] == status["dead"] == 0
    assert status["consumers"] == []
    assert status["delayed"]["total"] == 0 and status["delayed"]["sites"] == []
    assert status["throughput"] == {"added_total": 0, "finished_total": 0}


def test_status_shows_delayed_tasks_by_site_why_and_when(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    """Nothing waits and nothing is pending, but tasks sit in the delayed set: status says so
    (it used to show 0 / 0 / 0, and the crawl looked finished)."""
    keys = KeyLayout(namespace)
    now_ms = int(sync_redis.time()[0]) * 1000
    hostile = "evil\x1b[2Jsite"  # an escape sequence must not reach the terminal
    members = {}
    for i, (site, code) in enumerate([("news", 1), ("news", 1), ("news", 2), (hostile, 3)]):
        task = ExecTask.create(seed_id="s1", site_id=site, url=f"https://news.test/{i}")
        members[f"retry:normal|{task.to_message()['t']}"] = now_ms + 29_999 + code / 16
    members[ExecTask.create(seed_id="s1", site_id="old", url="https://old.test/").to_message()[
        "t"]] = now_ms - 5_000  # deferred by an older version: no reason, and overdue
    sync_redis.zadd(keys.delayed, members)

    status = run_json(redis_url, namespace, "status")
    assert (status["backlog"], status["pending"]) == (0, 0)
    delayed = status["delayed"]
    assert delayed["total"] == 5
    assert delayed["reasons"] == {"retry": 2, "paused": 1, "sick": 1, "unknown": 1}
    rows = {s["site_id"]: s for s in delayed["sites"]}
    assert rows["news"]["count"] == 3 and rows["news"]["reasons"] == {"retry": 2, "paused": 1}
    assert rows[hostile]["reasons"] == {"sick": 1}
    assert rows["old"]["next_due_in_s"] < 0 and delayed["next_due_in_s"] < 0
    assert 0 < rows["news"]["next_due_in_s"] <= 30

    code, text, _ = run(redis_url, namespace, "status")
    assert code == 0 and "\x1b" not in text
    line = next(x for x in text.splitlines() if x.startswith("delayed"))
    assert " 5 " in line and "overdue" in line and "retry 2" in line and "unknown 1" in line
    assert "evil\\x1b[2Jsite" in text and "paused 1" in text  # escaped (cli.common.printable)


def test_dead_list_show_and_site_filter(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    news = ExecTask.create(seed_id="s1", site_id="news", url="https://news.test/a")
    shop = ExecTask.create(seed_id="s1", site_id="shop", url="https://shop.test/b")
    id_news = add_dead(sync_redis, keys, news.to_message()["t"], "HTTP 503\ntraceback")
    add_dead(sync_redis, keys, shop.to_message()["t"])
    id_bad = add_dead(sync_redis, keys, json.dumps({"x": "garbage"}), "malformed message")

    listed = run_json(redis_url, namespace, "dead", "list")
    assert [d["id"] for d in listed] == [id_news, listed[1]["id"], id_bad]
    assert listed[0]["url"] == news.url and listed[0]["deliveries"] == 5
    assert listed[2]["requeueable"] is False and listed[2]["url"] is None
    assert [d["site_id"] for d in run_json(redis_url, namespace, "dead", "list", "--site",
                                           "shop")] == ["shop"]
    assert len(run_json(redis_url, namespace, "dead", "list", "--limit", "1")) == 1

    shown = run_json(redis_url, namespace, "dead", "show", id_news)
    assert shown["task"]["task_id"] == news.task_id and shown["reason"].startswith("HTTP 503")
    code, text, _ = run(redis_url, namespace, "dead", "show", id_news)
    assert code == 0 and news.url in text and "traceback" in text
    code, _, err = run(redis_url, namespace, "dead", "show", "9-9")
    assert code == 1 and "no dead letter 9-9" in err
    # Also by the task id or the task message id it was dead-lettered under (the worker's log
    # line names the dead letter's own id too).
    assert run_json(redis_url, namespace, "dead", "show", shop.task_id)["site_id"] == "shop"
    assert run_json(redis_url, namespace, "dead", "show", "1-1")["id"] == id_news  # source_id
    code, _, err = run(redis_url, namespace, "dead", "show", "0" * 32)
    assert code == 1 and "(by task id)" in err
    code, _, err = run(redis_url, namespace, "dead", "show", "news.test/a")
    assert code != 0 and "not a dead-letter id, task id or message id" in err


def test_requeue_bypasses_dedup_and_clears_notes(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    task = ExecTask.create(seed_id="s1", site_id="news", url="https://news.test/a")
    # Its URL is still marked as seen (as when a seed re-added it): requeue must not care.
    sync_redis.sadd(keys.seen("news"), fingerprint_bytes(task).hex())
    sync_redis.set(keys.done(task.task_id), "{}")
    sync_redis.set(keys.failed(task.task_id), "boom")
    dead_id = add_dead(sync_redis, keys, task.to_message()["t"])
    bad_id = add_dead(sync_redis, keys, json.dumps({"v": "9"}), "malformed message")

    code, out, err = run(redis_url, namespace, "dead", "requeue", dead_id, bad_id, "--json")

    assert code == 1  # one could not be requeued
    result = json.loads(out)
    assert [r["id"] for r in result["requeued"]] == [dead_id]
    assert [k["id"] for k in result["kept"]] == [bad_id]
    entries = sync_redis.xrange(keys.stream)
    assert len(entries) == 1
    assert ExecTask.from_message(entries[0][1]) == task
    assert sync_redis.exists(keys.done(task.task_id), keys.failed(task.task_id)) == 0
    assert [e[0] for e in sync_redis.xrange(keys.dead)] == [bad_id]
    assert sync_redis.sismember(keys.seen("news"), fingerprint_bytes(task).hex())

    code, _, err = run(redis_url, namespace, "dead", "requeue", bad_id)
    assert code == 1 and "cannot requeue" in err and "kept" in err
    code, _, err = run(redis_url, namespace, "dead", "requeue", dead_id)
    assert code == 1 and f"no dead letter {dead_id}" in err
    assert sync_redis.xlen(keys.stream) == 1  # not requeued twice


def test_requeue_all_of_one_site(sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    for i in range(3):
        add_dead(sync_redis, keys, ExecTask.create(
            seed_id="s", site_id="news", url=f"https://n.test/{i}").to_message()["t"])
    shop_id = add_dead(sync_redis, keys, ExecTask.create(
        seed_id="s", site_id="shop", url="https://s.test/").to_message()["t"])

    result = run_json(redis_url, namespace, "dead", "requeue", "--all", "--site", "news")

    assert len(result["requeued"]) == 3 and result["kept"] == []
    sites = {ExecTask.from_message(f).site_id for _, f in sync_redis.xrange(keys.stream)}
    assert sites == {"news"} and sync_redis.xlen(keys.stream) == 3
    assert [e[0] for e in sync_redis.xrange(keys.dead)] == [shop_id]


def test_purge_needs_confirmation(sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    ids = [add_dead(sync_redis, keys, "{}") for _ in range(3)]

    code, _, err = run(redis_url, namespace, "dead", "purge", ids[0])
    assert code == 2 and "--yes" in err and sync_redis.xlen(keys.dead) == 3
    code, _, _ = run(redis_url, namespace, "dead", "purge", ids[0], stdin=Tty("n\n"))
    assert code == 1 and sync_redis.xlen(keys.dead) == 3
    code, out, _ = run(redis_url, namespace, "dead", "purge", ids[0], stdin=Tty("y\n"))
    assert code == 0 and "purged 1" in out and sync_redis.xlen(keys.dead) == 2

    assert run_json(redis_url, namespace, "dead", "purge", "--all", "--yes") == {
        "purged": 2, "not_found": 0}
    assert sync_redis.xlen(keys.dead) == 0


def test_purge_older_than_trims_by_the_age_of_dead_letters(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    now_ms = int(sync_redis.time()[0]) * 1000  # type: ignore[index]
    old = [str(sync_redis.xadd(keys.dead, {"t": "{}"}, id=f"{now_ms - 3 * 86400_000 + i}-0"))
           for i in range(3)]
    recent = add_dead(sync_redis, keys, "{}")
    code, _, err = run(redis_url, namespace, "dead", "purge", "--older-than", "soon", "--yes")
    assert code == 2 and "--older-than" in err
    code, _, err = run(redis_url, namespace, "dead", "purge", old[0], "--older-than", "1d")
    assert code == 2 and "one of them" in err
    assert run_json(redis_url, namespace, "dead", "purge", "--older-than", "2d", "--yes") == {
        "purged": 3}
    assert [i for i, _ in sync_redis.xrange(keys.dead)] == [recent]  # type: ignore[misc]


def test_reset_deletes_only_the_namespace(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    add_tasks(sync_redis, keys, 3)
    add_dead(sync_redis, keys, "{}")
    sync_redis.set(keys.done("x"), "1")
    # A namespace that a glob would match if the CLI did not escape it.
    sync_redis.set(f"{namespace}x:tasks", "other")
    try:
        code, _, _ = run(redis_url, namespace, "reset")
        assert code == 2 and sync_redis.exists(keys.stream)
        assert run_json(redis_url, namespace, "reset", "--yes") == {
            "namespace": namespace, "deleted": 4}
        assert list(sync_redis.scan_iter(f"{namespace}:*")) == []
        assert sync_redis.get(f"{namespace}x:tasks") == "other"
    finally:
        sync_redis.delete(f"{namespace}x:tasks")


def test_glob_characters_in_a_namespace_match_only_that_namespace(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    sync_redis.set(f"{namespace}:done:a", "1")
    assert run_json(redis_url, namespace[:-1] + "*", "reset", "--yes")["deleted"] == 0
    assert sync_redis.exists(f"{namespace}:done:a")


def test_unreachable_redis_is_one_line_and_exit_2(namespace: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for argv in (["status"], ["dead", "list"], ["reset", "--yes"]):
        code, out, err = run(url, namespace, *argv)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and "Traceback" not in err and "127.0.0.1" in err


def test_defaults_come_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, sync_redis: redis.Redis, redis_url: str,
        namespace: str) -> None:
    monkeypatch.setenv("METEORSEED_REDIS_URL", redis_url)
    monkeypatch.setenv("METEORSEED_NAMESPACE", namespace)
    add_tasks(sync_redis, KeyLayout(namespace), 2)
    out = io.StringIO()
    assert main(["status", "--json"], stdout=out) == 0
    assert json.loads(out.getvalue())["backlog"] == 2


def test_installed_console_script(sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    add_tasks(sync_redis, KeyLayout(namespace), 5)
    script = Path(sys.executable).with_name("meteorseed")
    proc = subprocess.run([str(script), "status", "--json", "--redis-url", redis_url,
                           "--namespace", namespace], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["backlog"] == 5


def test_defaults_come_from_the_scrapy_project(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sync_redis: redis.Redis,
        redis_url: str, namespace: str) -> None:
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = cliproj_settings\n")
    (tmp_path / "cliproj_settings.py").write_text(
        f"METEORSEED_REDIS_URL = {redis_url!r}\nMETEORSEED_NAMESPACE = {namespace!r}\n")
    for name in ("METEORSEED_REDIS_URL", "METEORSEED_NAMESPACE", "REDIS_URL",
                 "SCRAPY_SETTINGS_MODULE"):
        # setenv first, so that teardown also removes what Scrapy's init_env() sets here.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    add_tasks(sync_redis, KeyLayout(namespace), 3)
    out = io.StringIO()
    assert main(["status", "--json"], stdout=out) == 0
    assert json.loads(out.getvalue())["backlog"] == 3

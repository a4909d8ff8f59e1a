"""Seeds to tasks: line parsing, URL expansion, the expansion engine on a real Redis, and the real
``scrapy seed-expand`` command run as a subprocess (inside and outside a Scrapy project)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.seeding.expand import expand_lines
from meteorseed_scrapy.seeding.expand_types import ExpandOptions, ExpandSummary, Rejection
from meteorseed_scrapy.seeding.seed_lines import (
    MAX_LINE_BYTES,
    SeedLineError,
    parse_seed_line,
    read_lines,
)
from meteorseed_scrapy.seeding.seed_urls import MAX_URLS_PER_LINE, UrlError, expand
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.subprocess_env import python_path

REPO = Path(__file__).resolve().parents[1]
SCRAPY = Path(sys.executable).with_name("scrapy")
SUMMARY = re.compile(r"^read (\d+) lines, enqueued (\d+), duplicates (\d+), rejected (\d+)$")


def seed_line(urls: list[Any], seed_id: str = "s1", **fields: Any) -> str:
    seed = {"seed_id": seed_id, "site_id": "news", "task_type": "url_list",
            "payload": {"urls": urls}, **fields}
    return json.dumps(seed)


def stream_urls(sync_redis: redis.Redis, namespace: str) -> list[str]:
    entries: Any = sync_redis.xrange(KeyLayout(namespace).stream)  # redis-py's union type
    return [ExecTask.from_message(fields).url for _, fields in entries]


def run_expand(redis_url: str, namespace: str, lines: Any, **kwargs: Any
               ) -> tuple[ExpandSummary, list[str]]:
    errors: list[str] = []

    async def main() -> ExpandSummary:
        client = aioredis.Redis.from_url(redis_url)
        try:
            writer = TaskWriter(client, KeyLayout(namespace))
            return await expand_lines(
                lines, writer, ExpandOptions(**kwargs), on_error=lambda e: errors.append(str(e))
            )
        finally:
            await client.aclose()

    return asyncio.run(main()), errors


# -- parse_seed_line and expand ------------------------------------------------------------------

def test_parse_seed_line_reads_a_seed() -> None:
    seed = parse_seed_line(seed_line(["https://a.example/"], priority=3, callback="parse_x",
                                     parse_rule="r1", meta={"k": 1}), 7)
    assert (seed.seed_id, seed.site_id, seed.priority, seed.task_type) == ("s1", "news", 3,
                                                                          "url_list")
    [task] = list(expand(seed))
    assert isinstance(task, ExecTask)
    assert (task.seed_id, task.site_id, task.url) == ("s1", "news", "https://a.example/")
    assert (task.priority, task.callback) == (3, "parse_x")
    assert task.meta == {"k": 1, "parse_rule": "r1"}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "seed: must be a JSON object"),
        ('{"seed_id": "s1", "task_type": "url_list", "payload": {"urls": []}}',
         "site_id: is missing"),
        (seed_line(["https://a.example/"], extra=1),
         "extra: is not a seed field (expected callback, lane, meta, notify"),
        (seed_line([], task_type="nope"), "task_type: must be one of"),
        (seed_line([], task_type=["url_list"]), "is not a valid seed"),
        ('{"seed_id": "s1", "site_id": "news", "task_type": "url_list", "payload": {}}',
         "payload.urls: must be a list"),
        (seed_line([], task_type="sitemap"),
         "payload.urls: is not a field of a sitemap payload (expected lastmod_after, "
         "recrawl_after, url)"),
        ('{"seed_id": "s1", "site_id": "news", "task_type": "sitemap", "payload": {}}',
         "payload.url: must be a non-empty string"),
        (seed_line([], task_type="url_template"),
         "payload.urls: is not a field of a url_template payload"),
        ('{"seed_id": "s1", "site_id": "news", "task_type": "url_template", "payload": {}}',
         "payload.template: must be a non-empty"),
        (seed_line([], meta={"recrawl_after": "1d"}), "meta.recrawl_after: must be a whole"),
        (seed_line([]).replace('"urls": []', '"urls": [], "urls_count": NaN'),
         "payload.urls_count: must be a whole number >= 0, got nan"),
        (seed_line([]).replace('"urls": []', '"urls": [], "urls_count": true'),
         "payload.urls_count: must be a whole number >= 0, got True"),
        (seed_line([]).replace('"urls": []', '"urls": [], "urls_sha256": {"a": 1}'),
         "payload.urls_sha256: must be a hex digest"),
        (seed_line(["https://a.example/"] * (MAX_URLS_PER_LINE + 1)),
         f"limit of {MAX_URLS_PER_LINE} per line"),
        (seed_line(["https://a.example/\\ud800"]).replace("\\\\ud800", "\\ud800"),
         "unpaired surrogate"),
        ("[" * 100_000 + "]" * 100_000, "[0]" * 64 + ": nests deeper than 64 levels"),
    ],
)
def test_parse_seed_line_rejects_with_line_number_and_reason(line: str, reason: str) -> None:
    with pytest.raises(SeedLineError) as info:
        parse_seed_line(line, 42)
    assert info.value.lineno == 42
    assert reason in info.value.reason
    assert str(info.value).startswith("line 42: ")


def test_parse_seed_line_limits_line_size_in_utf8_bytes() -> None:
    ok = seed_line(["https://a.example/"], meta={"pad": ""})
    pad = MAX_LINE_BYTES - len(ok.encode())
    assert parse_seed_line(ok.replace('"pad": ""', '"pad": "' + "x" * pad + '"'), 1)
    too_long = ok.replace('"pad": ""', '"pad": "' + "é" * (pad // 2 + 1) + '"')  # 2 bytes each
    with pytest.raises(SeedLineError, match=f"limit of {MAX_LINE_BYTES} bytes"):
        parse_seed_line(too_long, 1)
    with pytest.raises(SeedLineError, match="not valid UTF-8"):
        parse_seed_line(b'{"seed_id": "\xff"}', 1)


def test_expand_reports_bad_urls_by_position_and_keeps_the_rest() -> None:
    seed = parse_seed_line(seed_line([
        "https://a.example/0", "ftp://a.example/1", 5, "https://a.example:99999/3",
        "https://a.example/" + "x" * 70_000, "https://a.example/5",
    ]), 1)
    items = list(expand(seed))
    assert [i.url for i in items if isinstance(i, ExecTask)] == [
        "https://a.example/0", "https://a.example/5"
    ]
    errors = [i for i in items if isinstance(i, UrlError)]
    assert [e.position for e in errors] == [1, 2, 3, 4]
    assert "http(s) URL" in errors[0].reason
    assert "non-empty string" in errors[1].reason
    assert "canonicalised" in errors[2].reason
    assert "bytes" in errors[3].reason


def test_expand_rejects_urls_over_2kb_and_bad_schemes_by_position() -> None:
    seed = parse_seed_line(seed_line([
        "https://a.example/" + "x" * 2100, "file:///etc/passwd", "javascript:alert(1)",
        "data:text/html,hi", "https://a.example/ok",
    ]), 1)
    items = list(expand(seed))
    assert [i.url for i in items if isinstance(i, ExecTask)] == ["https://a.example/ok"]
    errors = [i for i in items if isinstance(i, UrlError)]
    assert [e.position for e in errors] == [0, 1, 2, 3]
    assert "longer than 2048 bytes" in errors[0].reason
    assert all("http(s) URL" in e.reason for e in errors[1:])


def test_read_lines_bounds_each_line_and_keeps_line_numbers() -> None:
    data = b"one\r\ntwo\n" + b"x" * 50 + b"\n" + b"y" * 10 + b"\nlast"
    lines = list(read_lines(io.BytesIO(data), max_bytes=10))
    assert lines[:2] == [b"one", b"two"]
    assert len(lines[2]) > 10 and len(lines[2]) <= 12  # cut, the rest skipped unread
    assert lines[3:] == [b"y" * 10, b"last"]


# -- the engine against Redis ------------------------------------------------------------------

def test_expand_lines_enqueues_good_input_and_reports_the_bad(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    lines = [
        seed_line(["https://a.example/1", "nope", "https://a.example/2"]),  # line 1
        "{bad json",  # line 2
        "",  # line 3: blank, skipped
        '{"seed_id": "s2", "task_type": "url_list", "payload": {"urls": []}}',  # line 4
        seed_line(["https://a.example/2", "https://a.example/3"], seed_id="s3"),  # line 5
    ]
    summary, errors = run_expand(redis_url, namespace, lines, batch_size=2)
    assert str(summary) == "read 5 lines, enqueued 3, duplicates 1, rejected 3"
    assert (summary.bad_lines, summary.bad_urls) == (2, 1)
    assert errors[0].startswith("line 1, url 1: url: must be an http(s) URL")
    assert errors[1].startswith("line 2: is not valid JSON")
    assert errors[2] == "line 4: site_id: is missing"
    assert stream_urls(sync_redis, namespace) == [
        "https://a.example/1", "https://a.example/2", "https://a.example/3"
    ]


def test_a_2mb_line_of_10000_urls_is_accepted(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    stub = seed_line([])
    per_url = (MAX_LINE_BYTES - len(stub) - 100) // MAX_URLS_PER_LINE - 4  # quotes, ", "
    urls = [f"https://a.example/{i:05d}?p=".ljust(per_url, "x") for i in range(MAX_URLS_PER_LINE)]
    line = seed_line(urls).encode()
    assert 2_000_000 < len(line) <= MAX_LINE_BYTES
    source = io.BytesIO(line + b"\n" + seed_line([*urls, "https://a.example/one-more"]).encode())
    summary, errors = run_expand(redis_url, namespace, read_lines(source))
    assert summary.enqueued == MAX_URLS_PER_LINE
    assert errors == [
        f"line 2: payload.urls: has {MAX_URLS_PER_LINE + 1} URLs, more than the limit of "
        f"{MAX_URLS_PER_LINE} per line"
    ]
    assert sync_redis.xlen(KeyLayout(namespace).stream) == MAX_URLS_PER_LINE


def test_expand_lines_pauses_while_the_backlog_is_over_the_limit(
    redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    keys = KeyLayout(namespace)
    waits: list[int] = []

    def on_wait(backlog: int) -> None:
        # a worker drains the stream while the seeder waits
        waits.append(backlog)
        sync_redis.xgroup_create(keys.stream, keys.group, id="0")
        reply: Any = sync_redis.xreadgroup(keys.group, "c1", {keys.stream: ">"})
        ids = [msg_id for _, messages in reply for msg_id, _ in messages]
        sync_redis.xack(keys.stream, keys.group, *ids)
        sync_redis.xdel(keys.stream, *ids)

    lines = [seed_line([f"https://a.example/{i}" for i in range(6)])]
    summary, _ = run_expand(redis_url, namespace, lines, batch_size=2, max_backlog=3,
                            on_wait=on_wait)
    assert waits == [4]  # batches 1 and 2 went in, batch 3 waited for room
    assert summary.enqueued == 6
    assert sync_redis.xlen(keys.stream) == 2


# -- the real command --------------------------------------------------------------------------

def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SCRAPY_SETTINGS_MODULE", None)  # outside a project unless cwd holds scrapy.cfg
    env.pop("REDIS_URL", None)
    # Run this checkout's code whatever an installed copy holds (the entry point is by name).
    env["PYTHONPATH"] = python_path(REPO, env.get("PYTHONPATH", ""))
    return env


def run_cli(args: list[str], cwd: Path, *, settings: dict[str, str] | None = None,
            stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    options = [arg for name, value in (settings or {}).items() for arg in ("-s", f"{name}={value}")]
    proc = subprocess.run(
        [str(SCRAPY), "seed-expand", *args, *options], cwd=cwd, env=cli_env(), input=stdin,
        capture_output=True, timeout=300,
    )
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(),
                                       proc.stderr.decode())


def summary_of(stdout: str) -> tuple[int, ...]:
    match = SUMMARY.match(stdout.strip().splitlines()[-1])
    assert match, stdout
    return tuple(int(g) for g in match.groups())


def test_cli_outside_a_project_reports_bad_input_and_fails(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join([
        seed_line(["https://a.example/1", "https://a.example/2"]),
        '{"seed_id": "s2", "site_id": "news", "task_type": "url_list"}',
        seed_line(["https://a.example/2", "mailto:x@a.example", "https://a.example/3"]),
        "not json at all",
    ]) + "\n")
    proc = run_cli([seeds.name], tmp_path,
                   settings={"METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace})
    assert proc.returncode == 1, proc.stderr
    assert summary_of(proc.stdout) == (4, 3, 1, 3)
    assert proc.stderr.splitlines() == [
        "line 2: payload: is missing",
        "line 3, url 1: url: must be an http(s) URL, got 'mailto:x@a.example'",
        "line 4: is not valid JSON (Expecting value at column 1)",
    ]
    assert stream_urls(sync_redis, namespace) == [
        "https://a.example/1", "https://a.example/2", "https://a.example/3"
    ]


def test_cli_reads_stdin_and_succeeds_with_dedup_and_without(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    data = (seed_line(["https://a.example/1", "https://a.example/1#x"]) + "\n").encode()
    settings = {"METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace}
    proc = run_cli(["-"], tmp_path, settings=settings, stdin=data)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == "read 1 lines, enqueued 1, duplicates 1, rejected 0\n"
    proc = run_cli(["-", "--no-dedup"], tmp_path, settings=settings, stdin=data)
    assert summary_of(proc.stdout) == (1, 2, 0, 0)
    assert sync_redis.xlen(KeyLayout(namespace).stream) == 3


def test_cli_inside_a_project_reads_project_settings(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = proj.settings\n")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "settings.py").write_text(
        f"BOT_NAME = 'proj'\nMETEORSEED_REDIS_URL = {redis_url!r}\n"
        f"METEORSEED_NAMESPACE = {namespace!r}\n"
    )
    (tmp_path / "seeds.jsonl").write_text(seed_line(["https://a.example/p"]) + "\n")
    proc = run_cli(["seeds.jsonl"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert stream_urls(sync_redis, namespace) == ["https://a.example/p"]


def test_two_cli_processes_enqueue_each_url_once(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    urls = [f"https://a.example/item/{i}" for i in range(5000)]
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("".join(seed_line(urls[i:i + 1000]) + "\n" for i in range(0, 5000, 1000)))
    cmd = [str(SCRAPY), "seed-expand", str(seeds), "--batch-size", "100",
           "-s", f"METEORSEED_REDIS_URL={redis_url}", "-s", f"METEORSEED_NAMESPACE={namespace}"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    summaries = [summary_of(out) for out, _ in outputs]
    assert sum(s[1] for s in summaries) == 5000  # enqueued
    assert sum(s[2] for s in summaries) == 5000  # duplicates
    assert sync_redis.xlen(KeyLayout(namespace).stream) == 5000
    assert sorted(stream_urls(sync_redis, namespace)) == sorted(urls)


def test_cli_unreachable_redis_is_one_line_and_exit_code_2(
    tmp_path: Path, refused_port: int
) -> None:
    (tmp_path / "seeds.jsonl").write_text(seed_line(["https://a.example/"]) + "\n")
    url = f"redis://:secret@127.0.0.1:{refused_port}/0"
    proc = run_cli(["seeds.jsonl"], tmp_path, settings={"METEORSEED_REDIS_URL": url})
    assert proc.returncode == 2
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("seed-expand: cannot reach Redis at redis://***@127.0.0.1:")
    assert "secret" not in line


def test_cli_missing_file_and_usage_errors(tmp_path: Path, redis_url: str) -> None:
    proc = run_cli(["nope.jsonl"], tmp_path, settings={"METEORSEED_REDIS_URL": redis_url})
    assert proc.returncode == 2
    assert proc.stderr.startswith("seed-expand: cannot read nope.jsonl")
    assert run_cli([], tmp_path).returncode == 2
    assert run_cli(["a", "--batch-size", "0"], tmp_path).returncode == 2


def test_cli_help_says_how_positions_are_counted(tmp_path: Path) -> None:
    proc = run_cli(["--help"], tmp_path)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "0-based index of the URL in payload.urls" in text
    assert "--batch-size" in text and "--no-dedup" in text


def test_redact_hides_only_the_password() -> None:
    assert redact("redis://:pw@h:1/0") == "redis://***@h:1/0"
    assert redact("rediss://user:pw@h/2") == "rediss://user:***@h/2"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"


def test_rejection_formats() -> None:
    assert str(Rejection(3, "bad")) == "line 3: bad"
    assert str(Rejection(3, "bad", 0)) == "line 3, url 0: bad"


def test_cli_rejects_urls_outside_a_ruled_sites_domains_by_position(
    tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis
) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "news.yaml").write_text(
        'site_id: news\nversion: "1"\nstart: detail\nallowed_domains: [a.example]\n'
        'blacklist: ["/admin/"]\nfields:\n  title: {css: "title::text"}\n'
    )
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join([
        seed_line(["https://a.example/1", "https://evil.example/2", "https://a.example/admin/3"]),
        seed_line(["https://elsewhere.example/1"], seed_id="s2", site_id="unruled"),
    ]) + "\n")
    proc = run_cli([seeds.name], tmp_path, settings={
        "METEORSEED_REDIS_URL": redis_url, "METEORSEED_NAMESPACE": namespace,
        "METEORSEED_SITES_DIR": str(sites)})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        "line 1, url 1: url: host 'evil.example' is not in the allowed domains of site news"
        " (a.example)",
        "line 1, url 2: url: matches the blacklist pattern '/admin/' of site news",
    ]
    # A site without a rule config has no domain restriction.
    assert stream_urls(sync_redis, namespace) == [
        "https://a.example/1", "https://elsewhere.example/1"]
